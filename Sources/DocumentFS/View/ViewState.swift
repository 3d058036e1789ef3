import DocumentEngine
import FUSE
import Foundation
import VersionedStore

/// An open file handle.
struct OpenFile {
    var node: ViewNode
    var writable: Bool
    /// What a read-only open saw: reads keep to it if another process replaces the file.
    var generation: UInt64
    var snapshot: ContentBase?
    /// This handle wrote since its last flush.
    var wrote = false
    /// Processes (thread group ids) that wrote through this handle: only their close is a
    /// save point. A FLUSH also comes from every child that merely inherited the descriptor
    /// (at its exec or exit), which must not save a half-written file. With the writeback
    /// cache, writes reach the mount from the page cache without their writer, so the
    /// process that opened the file for writing counts as its writer.
    var writers: Set<Int32> = []
    /// Lock owners that took locks through this open (``FileLocks``): its release releases them.
    var lockOwners: Set<Int64> = []
    /// The mount's lock lease ended while this open held locks: its I/O fails with `EIO`.
    var lockLost = false
}

/// One readdir entry. `cookie` is the offset that continues *after* it.
struct DirectoryEntry {
    var cookie: UInt64
    var name: FUSE.FileName
    var ino: UInt64
    var attributes: FileAttributes
}

/// An open directory handle.
struct OpenDirectory {
    var ino: UInt64
    /// Taken at the first readdir, so that opening a directory (to fsync it, say) costs
    /// nothing however big it is.
    var entries: [DirectoryEntry]?
    /// Set once a readdir served this snapshot; a later offset-0 read (rewinddir) rebuilds.
    var served = false
}

/// Everything the view's one lock guards: the tree of nodes the kernel may name, the documents
/// behind them, the mount root's entries, and the open handles. Rooms whose fields must change
/// together with the tree (the Trash's and history's folders, conflict entries) keep them here.
///
/// The view's classes (``ViewNode``, ``DocumentState``, ``FileContents``, ``SpillLayer``,
/// ``ConflictEntry``, ``VersionTree``) are not `Sendable`, so the compiler keeps them out of
/// every value and closure that crosses threads (plans, snapshots, the save queue, the
/// background threads): those carry ids and values. This state is the one way they cross.
// @unchecked: the one exception the view needs: `MountView.state` (a `Locked`) holds it, and its
// classes are used only under that lock, which the compiler does not see (concurrency.md).
struct ViewState: @unchecked Sendable {
    var listed = false
    var documents: [DocumentID: DocumentState] = [:]
    /// Unresolved conflict versions shown at the mount root.
    var conflicts: [VersionID: ConflictEntry] = [:]
    var nextConflictInode: UInt64 = 0
    /// What the mount root shows: documents' nodes, conflict entries and scratch files.
    var rootEntries = Children()
    /// Every node the kernel may name, by inode number.
    var nodes: [UInt64: ViewNode] = [:]
    var files: [UInt64: OpenFile] = [:]
    var directories: [UInt64: OpenDirectory] = [:]
    var nextHandle: UInt64 = 1
    /// Threads whose open of an old inode was refused with `ESTALE`, and when: the kernel's
    /// retry comes at once, and is never refused again (``DocumentFileSystem/open``).
    var staleRefusals: [Int32: ContinuousClock.Instant] = [:]
    /// A signature of each directory's last listing, for `keep_cache` on `opendir`.
    var listedGenerations: [UInt64: UInt64] = [:]
    var rootChanged: Timespec = .now
    /// Counts this mount's changes to the set of documents and their names (each
    /// ``changingRoot(_:)``, and an install) and to the conflict entries it shows, so that ``Reconciler/refreshListing()`` can tell that a store listing it took is older
    /// than the state it is about to reconcile with it.
    var rootGeneration: UInt64 = 0
    /// This mount's changes of the root's documents between their store transaction and
    /// the view's update (``changingRoot(_:)``): a listing read meanwhile may show the commit
    /// before the view does, so ``Reconciler/refreshListing()`` applies none while any is in flight.
    var rootChangesInFlight = 0
    /// Node ids taken from the store in batches for new files.
    var spareIDs: [StoreNodeID] = []
    /// Weak: the session owns the notifier, and the notifier's session core owns this file
    /// system, so a strong reference would keep all three (and the store's files) alive.
    weak var notifier: Notifier?
    var observer: StoreObserver?
    var stopping = false
    /// What the end of the session could not save yet (``unsavedDocuments``).
    var unsaved: [String] = []
    /// Names shown property lists left, and their kinds (`archives=xml`).
    /// The history's and the Trash's folders, made on first use.
    var virtualFolders: [VirtualRole: ViewNode] = [:]
    var nextVirtualInode: UInt64 = 0
    var formerPropertyLists: [FormerName: (kind: PropertyListText.Kind, shown: PropertyListText?)] = [:]
}
