import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import Threading
import VersionedStore

/// One file, directory or symbolic link of the mount as the kernel sees it. Part of the view:
/// not `Sendable`, and used only under the view lock (``ViewState``).
///
/// A node has its own store node id (its inode is that id plus one, stable across remounts)
/// and is saved as the wrapper ``persistAs``, which differs only when a file at the mount root
/// took over a flat document under the document's name (`sed -i` or vim saving a flat
/// document): the document keeps its identity and history.
final class ViewNode {
    let storeID: StoreNodeID
    var persistAs: StoreNodeID
    /// The document it belongs to; nil for a scratch file at the mount root.
    var document: DocumentID?
    weak var parent: ViewNode?
    /// Whether the node is the root of a document or a scratch file at the mount root (its
    /// parent is the mount root, which has no node).
    var atMountRoot: Bool
    var name: FUSE.FileName
    var record: NodeRecord
    /// Regular files only.
    var contents: FileContents?
    /// Directories only.
    var children = Children()
    /// False once unlinked or replaced: it lives on for open handles only.
    var linked = true
    /// For another name of a file (a hard link): the node of the file, which the kernel sees
    /// under every name. Such a node is only a directory entry: it is never in the inode map,
    /// has no contents, and is saved as a record that names the file's.
    var linkOf: ViewNode?
    /// The file's other names (hard links to it), for its link count.
    var aliases: [ObjectIdentifier: ViewNode] = [:]
    var openHandles = 0
    /// Held by a change of the file's bytes (a write, a truncation) for its whole run, since
    /// its spill I/O runs without the file system's lock: changes of one file run one at a
    /// time, as the kernel's own inode lock has them anyway.
    let changes = OrderedLock(.fileChanges)
    /// The contents generation at the last open, for `keep_cache`.
    var openedGeneration: UInt64?
    /// The sizes the kernel's retired inodes of this file (``MountRoom/renew(_:_:keptSize:)``)
    /// were given, by kernel node id: an open of one whose size is still right is served.
    var retiredSizes: [UInt64: Int64] = [:]
    /// The conflict version the node shows, read-only (see ``ConflictEntry``); nil for the
    /// document's own nodes.
    let conflict: VersionID?
    /// The kernel's key for the node (its node table key): its own store id plus one, or for a
    /// conflict version's node a number of its own (the store id is the current version's).
    let ino: UInt64
    /// Other keys the kernel knows this node by: a renamed conflict entry's or Trash item's,
    /// whose dentry the kernel moved onto the node's name (``MountRoom/standIn``).
    var kernelAliases: Set<UInt64> = []
    /// A folder the mount makes up (the history, the Trash); nil for the store's wrappers.
    let role: VirtualRole?
    /// The history or Trash tree the node shows, read-only; nil elsewhere (conflict entries
    /// included, which are found by ``conflict``).
    var tree: VersionTree?
    /// A virtual folder's children were listed from the store at least once.
    var listed = false

    init(
        storeID: StoreNodeID, document: DocumentID?, name: FUSE.FileName, record: NodeRecord,
        conflict: (version: VersionID, ino: UInt64)? = nil
    ) {
        self.storeID = storeID
        persistAs = storeID
        self.document = document
        self.name = name
        self.record = record
        atMountRoot = false
        self.conflict = conflict?.version
        ino = conflict?.ino ?? inodeNumber(storeID)
        role = nil
    }

    /// A virtual folder (``VirtualRole``) with its own inode number.
    init(role: VirtualRole, ino: UInt64, name: FUSE.FileName, record: NodeRecord) {
        storeID = StoreNodeID(rawValue: -1)
        persistAs = storeID
        document = nil
        self.name = name
        self.record = record
        atMountRoot = false
        conflict = nil
        self.ino = ino
        self.role = role
    }

    /// Where the node's entry sits in its directory's listing (a readdir offset continues after
    /// it): the store id plus 2 (1 and 2 are `.` and `..`), so it stays valid while entries
    /// change; a conflict entry's, or a virtual node's, is its inode number, past every store id.
    var cookie: UInt64 { conflict == nil && role == nil ? UInt64(bitPattern: storeID.rawValue) &+ 2 : ino }
    /// The `st_ino` shown when it is not ``ino``: a file that took over a flat document shows
    /// the document's inode (so it is the same after a remount), and the file it replaced
    /// shows another number so that no two files share one.
    var reportedIno: UInt64?
    var kind: FileWrapper.Kind { record.kind }

    var size: Int64 {
        switch record.kind {
        case .regularFile: return contents?.size ?? record.size
        case .symbolicLink: return Int64(record.linkTarget?.utf8.count ?? 0)
        case .directory: return 4096
        case .fifo, .socket, .characterDevice, .blockDevice: return 0
        }
    }

    var subdirectoryCount: Int { children.directoryCount }

    /// Whether `ancestor` is this node or above it.
    /// The node's contents, if they are still the ones `snapshot` froze.
    func contents(for snapshot: FileContents.Snapshot) -> FileContents? {
        guard let contents, contents.identity === snapshot.contents else { return nil }
        return contents
    }

    func isDescendant(of ancestor: ViewNode) -> Bool {
        var node: ViewNode? = self
        while let current = node {
            if current === ancestor { return true }
            node = current.parent
        }
        return false
    }
}

/// What the mount knows of one document: the store's view of it (the records at ``base``) and
/// the node tree the kernel sees, which may be ahead of the store until the next save. Part of
/// the view: not `Sendable`, and used only under the view lock (``ViewState``).
final class DocumentState {
    let id: DocumentID
    /// The store's listing, as last seen (its name is the store's name for it).
    var info: DocumentInfo
    /// The node shown at the mount root for the document.
    var root: ViewNode
    /// The records of the saved state this view is based on; nil until the tree is read.
    var committed: [StoreNodeID: NodeRecord]?
    var base: VersionID
    /// Something changed since the last save began.
    var dirty = false
    /// The nodes changed (or moved, or removed) since the last save began: a save looks at these
    /// only, so its cost follows the change, not the size of the document.
    var touched: [ObjectIdentifier: ViewNode] = [:]
    /// When the last change happened, for the quiet-interval save.
    var lastChange = ContinuousClock.now
    /// Serialises saves of this document.
    let saving: OrderedLock
    /// Another process saved: show its version once the mount has nothing unsaved.
    var needsReload = false
    /// The last save failed with this error; the next save point retries.
    var lastError: Errno?
    /// Changes the store logged for an `fsync` (``FileSystemStore/logIntent(_:)``) that no save
    /// has committed yet: the next save is durable, and retires them.
    var intents: [IntentID] = []
    /// A change of the document's name or existence at the mount root (a create, a rename, an
    /// exchange) was committed without waiting for the disk: an `fsync` of one of its files syncs
    /// the store too, so that the name is as durable as the contents.
    var namesUnsynced = false

    init(info: DocumentInfo, root: ViewNode) {
        id = info.id
        self.info = info
        self.root = root
        base = info.currentVersion
        saving = OrderedLock(.documentSaving, key: Int(info.id.rawValue))
    }

    var isLoaded: Bool { committed != nil }
}

/// `st_ino` of the mount root. Store node ids start at 1, so wrappers are shifted by one to
/// keep this number free (see ``inodeNumber(_:)``).
let mountRootInode: UInt64 = 1

/// The stable inode number of a store node: the same across remounts and processes because it
/// is derived from the store's own id, not from the kernel node id the table hands out.
func inodeNumber(_ id: StoreNodeID) -> UInt64 { UInt64(bitPattern: id.rawValue) &+ 1 }

extension Timestamp {
    /// The FUSE layer's time: the store keeps nanoseconds, and so does the kernel.
    var timespec: Timespec { Timespec(seconds: seconds, nanoseconds: nanoseconds) }

    init(_ time: Timespec) { self.init(seconds: time.seconds, nanoseconds: time.nanoseconds) }
}

extension NodeRecord {
    /// Equal apart from the version stamp the store assigns.
    func sameContent(as other: NodeRecord) -> Bool {
        var a = self
        var b = other
        a.version = VersionID(rawValue: 0)
        b.version = VersionID(rawValue: 0)
        return a == b
    }
}
