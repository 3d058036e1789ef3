import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import Threading
import VersionedStore

extension MountRoom {
    /// Runs a store call, turning its errors into the errno the caller should see.
    func storeCall<T>(_ body: () throws -> T) throws(Errno) -> T {
        do {
            return try body()
        } catch let error as DocumentStoreError {
            throw errno(for: error)
        } catch let error as Errno {
            throw error
        } catch {
            logger.error("store: \(error)")
            throw .ioError
        }
    }

    func errno(for error: DocumentStoreError) -> Errno {
        switch error {
        case .noSuchDocument, .noSuchNode: return .noSuchFileOrDirectory
        case .noSuchVersion: return .staleNFSFileHandle
        case .notARegularFile: return .isDirectory
        case .documentExists: return .fileExists
        case .invalidName(_, let reason):
            return reason.contains("longer") ? .fileNameTooLong : .invalidArgument
        case .noSpace:
            logger.error("store: \(error)")
            return .noSpace
        default:
            logger.error("store: \(error)")
            return .ioError
        }
    }

    func makeNode(storeID: StoreNodeID, document: DocumentID?, record: NodeRecord, name: FUSE.FileName)
        -> ViewNode
    {
        let node = ViewNode(storeID: storeID, document: document, name: name, record: record)
        if record.kind == .regularFile && record.linkOf == nil {
            node.contents = FileContents(
                base: ContentBase(node: record.id, version: record.version, size: record.size),
                spill: spillFiles)
        }
        return node
    }

    /// A fresh store node id (``newStoreIDs(count:)``).
    func newStoreID() throws(Errno) -> StoreNodeID { try newStoreIDs(count: 1)[0] }

    /// Fresh store node ids, taken from a pool the store reserves in batches of at least 64.
    /// A reservation is a durable transaction of its own that changes no name and no contents,
    /// so that the system calls the ids are for stay one transaction each.
    func newStoreIDs(count: Int) throws(Errno) -> [StoreNodeID] {
        guard count > 0 else { return [] }
        if let ids = state.withLock({ state -> [StoreNodeID]? in
            guard state.spareIDs.count >= count else { return nil }
            defer { state.spareIDs.removeLast(count) }
            return Array(state.spareIDs.suffix(count).reversed())
        }) {
            return ids
        }
        let fresh = try storeCall { try store.makeNodeIDs(count: max(64, count)) }
        return state.withLock { state in
            state.spareIDs.append(contentsOf: fresh.dropFirst(count).reversed())
            return Array(fresh.prefix(count))
        }
    }

    /// The node of a kernel node id (nil for the mount root).
    func node(_ state: inout State, _ id: NodeID) throws(Errno) -> ViewNode? {
        guard let ino = table.key(for: id) else { throw .noSuchFileOrDirectory }
        if ino == mountRootInode { return nil }
        guard let node = state.nodes[ino] else { throw .noSuchFileOrDirectory }
        return node
    }

    func document(_ state: inout State, of node: ViewNode) -> DocumentState? {
        node.document.flatMap { state.documents[$0] }
    }

    /// The kernel moved the dentry of `key` (a conflict entry, a Trash item) onto `node`'s name:
    /// until it looks the name up again, `key` stands for `node`.
    func standIn(_ state: inout State, _ key: UInt64, for node: ViewNode) {
        guard table.node(for: key) != nil else { return }
        state.nodes[key] = node
        node.kernelAliases.insert(key)
    }

    func forgotten(_ ino: UInt64) {
        state.withLock { state in
            // A number standing for another node (``standIn``).
            if let node = state.nodes[ino], node.ino != ino {
                state.nodes[ino] = nil
                node.kernelAliases.remove(ino)
                return
            }
            guard let node = state.nodes[ino], !node.linked, node.openHandles == 0 else { return }
            state.nodes[ino] = nil
        }
    }

    /// Whether the node is saved: linked into a document under names that are not scratch.
    func isPersisted(_ node: ViewNode) -> Bool {
        var current: ViewNode? = node
        while let n = current {
            guard n.linked, n.document != nil else { return false }
            if n.kind != .directory && configuration.scratchNames.matches(n.name) { return false }
            if n.atMountRoot { return true }
            current = n.parent
        }
        return false
    }

    func rootAttributes(_ state: inout State) -> FileAttributes {
        let packages = state.rootEntries.directoryCount
        return FileAttributes(
            ino: mountRootInode, type: .directory,
            permissions: FilePermissions(rawValue: 0o755), nlink: UInt32(clamping: 2 + packages),
            uid: rootOwner.uid, gid: rootOwner.gid, size: 4096,
            atime: state.rootChanged, mtime: state.rootChanged, ctime: state.rootChanged)
    }

    /// Points each hard link's node at its file's (records as read from the store).
    static func joinLinks(_ records: [NodeRecord], _ byID: [StoreNodeID: ViewNode]) {
        for record in records {
            guard let node = byID[record.id] else { continue }
            node.aliases = [:]
            node.linkOf = nil
        }
        for record in records {
            guard let target = record.linkOf, let node = byID[record.id], let file = byID[target],
                file.linkOf == nil
            else { continue }
            node.linkOf = file
            node.contents = nil
            if node.linked { file.aliases[ObjectIdentifier(node)] = node }
        }
    }

    func attributes(_ node: ViewNode) -> FileAttributes {
        // Every name of a file shows the file.
        if let file = node.linkOf { return attributes(file) }
        let type: FUSE.FileType
        // A file's link count: its own name, if it still has it, and its other names.
        var nlink = UInt32(clamping: (node.linked ? 1 : 0) + node.aliases.count)
        switch node.kind {
        case .regularFile: type = .regular
        case .directory:
            type = .directory
            nlink = UInt32(clamping: 2 + node.subdirectoryCount)
        case .symbolicLink: type = .symbolicLink
        case .fifo: type = .fifo
        case .socket: type = .socket
        case .characterDevice: type = .characterDevice
        case .blockDevice: type = .blockDevice
        }
        let record = node.record
        return FileAttributes(
            ino: node.reportedIno ?? node.ino, type: type,
            permissions: FilePermissions(rawValue: UInt32(record.permissions & 0o7777)),
            nlink: nlink, uid: record.uid, gid: record.gid, rdev: record.device,
            size: UInt64(clamping: node.size),
            atime: record.accessed.timespec, mtime: record.modified.timespec,
            ctime: record.changed.timespec)
    }

    func entry(_ reply: consuming ReplyEntry, _ node: ViewNode, _ attributes: FileAttributes) {
        reply.entry(
            node.ino, in: table, attributes: attributes,
            attributeTimeout: configuration.attributeTimeout, entryTimeout: configuration.entryTimeout)
    }
}
