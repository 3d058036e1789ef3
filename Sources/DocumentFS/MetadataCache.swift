import DocumentEngine
import FUSE

/// What a kernel node stands for: the mount's root, or one wrapper of one document.
///
/// A store node id is unique in the whole store and never reused, and a wrapper never moves to
/// another document, so (document, node) names the same thing for the store's life.
enum NodeKey: Hashable, Sendable {
    case mountRoot
    case wrapper(DocumentID, StoreNodeID)
}

/// `st_ino` of the mount root. Store node ids start at 1, so wrappers are shifted by one to
/// keep this number free (see ``inodeNumber(_:)``).
let mountRootInode: UInt64 = 1

/// The stable inode number of a store node: the same across remounts and processes because it
/// is derived from the store's own id, not from the kernel node id the table hands out.
func inodeNumber(_ id: StoreNodeID) -> UInt64 { UInt64(bitPattern: id.rawValue) &+ 1 }

/// One document's wrapper tree at one version, metadata only (no contents), indexed for
/// lookups and listings.
struct DocumentTree: Sendable {
    let document: DocumentID
    /// The document version these records are at.
    let version: VersionID
    let root: StoreNodeID
    let records: [StoreNodeID: NodeRecord]
    /// Children of each directory, in node id order: the order of readdir, whose cookies are
    /// node ids, so a listing continues correctly while entries come and go.
    let children: [StoreNodeID: [StoreNodeID]]
    /// Children of each directory by exact name bytes. Keyed by bytes, not `String`, because
    /// `String` equality is canonical equivalence: an NFD name must not find an NFC wrapper.
    let names: [StoreNodeID: [FUSE.FileName: StoreNodeID]]

    init(document: DocumentID, version: VersionID, root: StoreNodeID, records: [NodeRecord]) {
        self.document = document
        self.version = version
        self.root = root
        var byID: [StoreNodeID: NodeRecord] = [:]
        var children: [StoreNodeID: [StoreNodeID]] = [:]
        var names: [StoreNodeID: [FUSE.FileName: StoreNodeID]] = [:]
        for record in records {
            byID[record.id] = record
            if let parent = record.parent {
                children[parent, default: []].append(record.id)
                names[parent, default: [:]][FUSE.FileName(record.name)] = record.id
            }
        }
        for key in children.keys { children[key]?.sort() }
        self.records = byID
        self.children = children
        self.names = names
    }

    /// Subdirectories of `directory`, for its link count (2 + subdirectories).
    func subdirectoryCount(of directory: StoreNodeID) -> Int {
        (children[directory] ?? []).reduce(0) { count, id in
            records[id]?.kind == .directory ? count + 1 : count
        }
    }
}

/// The mount root's view of the store: its live documents.
struct RootListing: Sendable {
    let documents: [DocumentID: DocumentInfo]
    let byName: [FUSE.FileName: DocumentID]
    /// Documents in root node id order (readdir order, see ``DocumentTree/children``).
    let order: [DocumentID]

    init(_ documents: [DocumentInfo]) {
        var byID: [DocumentID: DocumentInfo] = [:]
        var byName: [FUSE.FileName: DocumentID] = [:]
        for info in documents {
            byID[info.id] = info
            byName[FUSE.FileName(info.name)] = info.id
        }
        self.documents = byID
        self.byName = byName
        order = documents.sorted { $0.root < $1.root }.map(\.id)
    }
}

extension Timestamp {
    /// The FUSE layer's time: the store keeps nanoseconds, and so does the kernel.
    var timespec: Timespec { Timespec(seconds: seconds, nanoseconds: nanoseconds) }
}
