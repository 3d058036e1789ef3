import DocumentEngine
import FUSE
import Foundation
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// The file system that shows a document store: the mount root lists the store's live
/// documents (a package document is a directory, a flat document a regular file), and inside a
/// package its wrappers are directories, regular files and symbolic links.
///
/// This first slice is read-only: every change answers `EROFS`. What it does:
///
/// - **Metadata from the store, contents on demand.** Listings, `stat`, `readlink` and xattrs
///   come from the wrapper records (cached per document version); `read` asks the store for
///   exactly the range, which reads only the chunks that cover it.
/// - **Stable inode numbers.** `st_ino` is the store node id plus one (the mount root is 1), so
///   it survives remounts; kernel node ids come from a ``NodeTable`` that keeps lookup counts.
/// - **Consistency.** A handle reads the document version it was opened at. Each `open`
///   revalidates the document (close-to-open), and a ``StoreObserver`` notices saves, creations,
///   renames and deletions by other processes and invalidates the kernel's caches through the
///   session's ``Notifier``.
///
/// Handlers block on the store: they run on libfuse's worker threads, never on Swift's
/// cooperative pool.
public final class DocumentFileSystem: FileSystem {
    /// Tunables.
    public struct Configuration: Sendable {
        /// How long the kernel may cache attributes.
        public var attributeTimeout: Duration = .seconds(1)
        /// How long the kernel may cache names.
        public var entryTimeout: Duration = .seconds(1)
        /// How often the store's event log is polled for other processes' changes.
        public var pollInterval: Duration = .milliseconds(100)
        public init() {}
    }

    /// The store shown.
    public let store: any DocumentStore
    public let configuration: Configuration
    private let logger: Logger
    private let table = NodeTable<NodeKey>(root: .mountRoot)
    private let state = Mutex(State())
    /// The last store event before this file system existed: the observer starts after it.
    private let startSequence: Int64
    /// Owner and times of the mount root, from the store file when it is a local file.
    private let rootOwner: (uid: UInt32, gid: UInt32)
    private let mountTime: Timespec

    private struct OpenFile {
        var document: DocumentID
        var node: StoreNodeID
        /// The document version the open saw: every read of this handle reads it.
        var version: VersionID
        var size: Int64
    }

    /// One readdir entry. `cookie` is the offset that continues *after* it.
    private struct DirectoryEntry {
        var cookie: UInt64
        var name: FUSE.FileName
        var key: NodeKey
        var attributes: FileAttributes
    }

    private struct OpenDirectory {
        var key: NodeKey
        var entries: [DirectoryEntry]
        /// Set once a readdir served this snapshot; a later offset-0 read (rewinddir) rebuilds.
        var served = false
    }

    private struct State {
        /// nil when it must be read again.
        var listing: RootListing?
        /// Bumped whenever the listing is dropped, so a slow reload cannot install stale data.
        var listingGeneration: UInt64 = 0
        var trees: [DocumentID: DocumentTree] = [:]
        var files: [UInt64: OpenFile] = [:]
        var directories: [UInt64: OpenDirectory] = [:]
        var nextHandle: UInt64 = 1
        /// The record version each wrapper had at its last open: unchanged means the kernel may
        /// keep its page cache (`keep_cache`).
        var openedVersions: [StoreNodeID: VersionID] = [:]
        /// A signature of each directory's last listing, for `keep_cache` on `opendir`.
        var listedSignatures: [NodeKey: Int] = [:]
        /// When the root listing last changed (the root's mtime).
        var rootChanged: Timespec?
        /// Weak: the session owns the notifier, and the notifier's session core owns this file
        /// system, so a strong reference would keep all three (and the store's files) alive.
        weak var notifier: Notifier?
        var observer: StoreObserver?
    }

    /// - Parameters:
    ///   - store: the store to show; a ``SQLiteStore`` shared with others is fine.
    ///   - configuration: timeouts and the poll interval.
    ///   - logger: where store errors are reported.
    public init(
        store: any DocumentStore, configuration: Configuration = Configuration(),
        logger: Logger = Logger(label: "docfs")
    ) throws {
        self.store = store
        self.configuration = configuration
        self.logger = logger
        startSequence = try store.latestEventSequence()
        var st = stat()
        if stat(store.location, &st) == 0 {
            rootOwner = (st.st_uid, st.st_gid)
        } else {
            rootOwner = (getuid(), getgid())
        }
        mountTime = .now
    }

    /// Connects the file system to the session serving it, so store changes can invalidate the
    /// kernel's caches. ``DocumentFSMount`` does this; call it yourself when you create the
    /// ``Session`` directly. The notifier is held weakly; the session keeps it.
    public func attach(_ notifier: Notifier) {
        state.withLock { $0.notifier = notifier }
    }

    /// Kernel nodes currently referenced (the root included), for tests of forget balance.
    public var referencedNodeCount: Int { table.count }

    // MARK: - Lifecycle

    public func initialize(_ config: inout KernelConfig) {
        do {
            try config.enable([.readdirplus, .readdirplusAuto])
        } catch {
            logger.notice("readdirplus not available: \(error)")
        }
        // Contents come from SQLite, not from a descriptor: splice cannot help (fuse-notes 2.1).
        config.disable([.spliceRead, .spliceWrite, .spliceMove])
        // The observer starts with the session, not with the object, so that a daemonizing
        // caller can fork between mount and start without a thread in flight.
        do {
            let observer = try StoreObserver(
                store: store, after: startSequence, interval: configuration.pollInterval
            ) { [weak self] events in
                self?.storeChanged(events)
            }
            state.withLock { $0.observer = observer }
        } catch {
            logger.error("cannot observe the store for changes: \(error)")
        }
    }

    public func destroy() {
        // The observer's thread keeps it alive until it is told to stop.
        let observer = state.withLock { state -> StoreObserver? in
            defer { state.observer = nil }
            return state.observer
        }
        observer?.stop()
    }

    // MARK: - The cache

    /// The live documents, from the cache or the store.
    private func listing() throws -> RootListing {
        let (cached, generation) = state.withLock { ($0.listing, $0.listingGeneration) }
        if let cached { return cached }
        let fresh = RootListing(try store.documents())
        state.withLock { state in
            if state.listingGeneration == generation { state.listing = fresh }
        }
        return fresh
    }

    /// The tree of `document`, from the cache or the store.
    private func tree(_ document: DocumentID) throws -> DocumentTree {
        if let cached = state.withLock({ $0.trees[document] }) { return cached }
        return try loadTree(document).new
    }

    /// Reads the document's current tree and installs it unless a newer one is cached; returns
    /// the tree that was cached before and the one cached now.
    @discardableResult
    private func loadTree(_ document: DocumentID) throws -> (old: DocumentTree?, new: DocumentTree) {
        let info = try store.document(document)
        // Both at one version: a save between the two reads cannot mix two trees.
        let records = try store.nodes(of: document, at: info.currentVersion)
        let fresh = DocumentTree(
            document: document, version: info.currentVersion, root: info.root, records: records)
        return state.withLock { state in
            let old = state.trees[document]
            // Versions only grow, so an older read never replaces a newer one.
            if let old, old.version >= fresh.version { return (old, old) }
            state.trees[document] = fresh
            return (old, fresh)
        }
    }

    /// The record and tree of a wrapper key.
    private func wrapper(_ document: DocumentID, _ id: StoreNodeID) throws(Errno) -> (
        NodeRecord, DocumentTree
    ) {
        let tree = try storeCall { try self.tree(document) }
        guard let record = tree.records[id] else { throw .noSuchFileOrDirectory }
        return (record, tree)
    }

    private func key(_ node: NodeID) throws(Errno) -> NodeKey {
        guard let key = table.key(for: node) else { throw .noSuchFileOrDirectory }
        return key
    }

    /// Runs a store call, turning its errors into the errno the caller should see.
    private func storeCall<T>(_ body: () throws -> T) throws(Errno) -> T {
        do {
            return try body()
        } catch let error as DocumentStoreError {
            switch error {
            case .noSuchDocument, .noSuchNode: throw .noSuchFileOrDirectory
            case .noSuchVersion: throw .staleNFSFileHandle
            case .notARegularFile: throw .isDirectory
            default:
                logger.error("store: \(error)")
                throw .ioError
            }
        } catch let error as Errno {
            throw error
        } catch {
            logger.error("store: \(error)")
            throw .ioError
        }
    }

    // MARK: - Attributes

    private func rootAttributes(_ listing: RootListing) throws(Errno) -> FileAttributes {
        var packages = 0
        var newest = mountTime
        for info in listing.documents.values {
            if info.kind == .package { packages += 1 }
        }
        if let changed = state.withLock({ $0.rootChanged }) { newest = changed }
        return FileAttributes(
            ino: mountRootInode, type: .directory,
            permissions: FilePermissions(rawValue: 0o755), nlink: UInt32(clamping: 2 + packages),
            uid: rootOwner.uid, gid: rootOwner.gid, size: 4096,
            atime: newest, mtime: newest, ctime: newest)
    }

    private func attributes(_ record: NodeRecord, in tree: DocumentTree) -> FileAttributes {
        let type: FUSE.FileType
        var size = UInt64(clamping: record.size)
        var nlink: UInt32 = 1
        switch record.kind {
        case .regularFile:
            type = .regular
        case .directory:
            type = .directory
            // A directory's size is not defined by POSIX; 4096 is what ext4 shows and what tools
            // that sum sizes expect to see.
            size = 4096
            nlink = UInt32(clamping: 2 + tree.subdirectoryCount(of: record.id))
        case .symbolicLink:
            type = .symbolicLink
            size = UInt64(record.linkTarget?.utf8.count ?? 0)
        }
        return FileAttributes(
            ino: inodeNumber(record.id), type: type,
            permissions: FilePermissions(rawValue: UInt32(record.permissions & 0o7777)),
            nlink: nlink, uid: record.uid, gid: record.gid, size: size,
            atime: record.accessed.timespec, mtime: record.modified.timespec,
            ctime: record.changed.timespec)
    }

    private func attributes(of key: NodeKey) throws(Errno) -> FileAttributes {
        switch key {
        case .mountRoot:
            return try rootAttributes(storeCall { try self.listing() })
        case .wrapper(let document, let id):
            let (record, tree) = try wrapper(document, id)
            return attributes(record, in: tree)
        }
    }

    // MARK: - Names

    public func lookup(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: ReplyEntry
    ) {
        answer(reply) { () throws(Errno) in
            let (key, attributes) = try child(named: name, of: self.key(parent))
            reply.entry(
                key, in: table, attributes: attributes,
                attributeTimeout: configuration.attributeTimeout,
                entryTimeout: configuration.entryTimeout)
        }
    }

    private func child(named name: FUSE.FileName, of parent: NodeKey) throws(Errno) -> (
        NodeKey, FileAttributes
    ) {
        switch parent {
        case .mountRoot:
            let listing = try storeCall { try self.listing() }
            guard let document = listing.byName[name], let info = listing.documents[document] else {
                throw .noSuchFileOrDirectory
            }
            let key = NodeKey.wrapper(document, info.root)
            return (key, try attributes(of: key))
        case .wrapper(let document, let id):
            let (record, tree) = try wrapper(document, id)
            guard record.kind == .directory else { throw .notDirectory }
            guard let child = tree.names[id]?[name], let childRecord = tree.records[child] else {
                throw .noSuchFileOrDirectory
            }
            return (.wrapper(document, child), attributes(childRecord, in: tree))
        }
    }

    public func forget(node: NodeID, lookups: UInt64) { table.forget(node, lookups: lookups) }
    public func batchForget(_ items: [ForgetItem]) { table.forget(items) }

    public func getattr(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle?, reply: ReplyAttr
    ) {
        answer(reply) { () throws(Errno) in
            reply.attributes(
                try attributes(of: key(node)), timeout: configuration.attributeTimeout)
        }
    }

    public func readlink(_ context: RequestContext, node: NodeID, reply: ReplyReadlink) {
        answer(reply) { () throws(Errno) in
            guard case .wrapper(let document, let id) = try key(node) else { throw .invalidArgument }
            let (record, _) = try wrapper(document, id)
            guard record.kind == .symbolicLink, let target = record.linkTarget else {
                throw .invalidArgument
            }
            reply.target(target)
        }
    }

    // MARK: - Files

    public func open(_ context: RequestContext, node: NodeID, flags: OpenFlags, reply: ReplyOpen) {
        answer(reply) { () throws(Errno) in
            guard !flags.isWritable, !flags.contains(.truncate) else { throw .readOnlyFileSystem }
            guard case .wrapper(let document, let id) = try key(node) else { throw .isDirectory }
            // Close-to-open: an open sees the document as it is now, even before the observer
            // has noticed another process's save.
            try storeCall { try revalidate(document) }
            let (record, tree) = try wrapper(document, id)
            guard record.kind == .regularFile else { throw .isDirectory }
            let (handle, keep) = state.withLock { state in
                let keep = state.openedVersions[id] == record.version
                state.openedVersions[id] = record.version
                let handle = state.nextHandle
                state.nextHandle += 1
                state.files[handle] = OpenFile(
                    document: document, node: id, version: tree.version, size: record.size)
                return (handle, keep)
            }
            reply.opened(FUSE.FileHandle(handle), options: keep ? [.keepCache] : [])
        }
    }

    public func read(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64, size: Int,
        reply: ReplyData
    ) {
        answer(reply) { () throws(Errno) in
            guard let file = state.withLock({ $0.files[handle.rawValue] }) else {
                throw .badFileDescriptor
            }
            guard offset < UInt64(clamping: file.size), size > 0 else {
                reply.data([UInt8]())
                return
            }
            let start = Int64(offset)
            let count = Int(min(Int64(size), file.size - start))
            let data = try storeCall {
                try store.readContents(of: file.node, at: file.version, offset: start, count: count)
            }
            reply.data(data)
        }
    }

    public func release(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, info: ReleaseInfo,
        reply: ReplyEmpty
    ) {
        _ = state.withLock { $0.files.removeValue(forKey: handle.rawValue) }
        reply.ok()
    }

    // MARK: - Directories

    public func opendir(
        _ context: RequestContext, node: NodeID, flags: OpenFlags, reply: ReplyOpen
    ) {
        answer(reply) { () throws(Errno) in
            let key = try key(node)
            if case .wrapper(let document, _) = key { try storeCall { try revalidate(document) } }
            let entries = try listDirectory(key)
            let signature = Self.signature(entries)
            let (handle, keep) = state.withLock { state in
                let keep = state.listedSignatures[key] == signature
                state.listedSignatures[key] = signature
                let handle = state.nextHandle
                state.nextHandle += 1
                state.directories[handle] = OpenDirectory(key: key, entries: entries)
                return (handle, keep)
            }
            // The kernel may cache the listing; a change invalidates the directory's inode.
            reply.opened(
                FUSE.FileHandle(handle), options: keep ? [.cacheDirectory, .keepCache] : [.cacheDirectory])
        }
    }

    /// What decides whether a cached listing is still right: names and node ids in order.
    private static func signature(_ entries: [DirectoryEntry]) -> Int {
        var hasher = Hasher()
        for entry in entries {
            hasher.combine(entry.cookie)
            hasher.combine(entry.name)
        }
        return hasher.finalize()
    }

    /// A directory's entries with their attributes, `.` and `..` first. Cookies are store node
    /// ids plus 2 (1 and 2 are `.` and `..`), so they stay valid while entries change.
    private func listDirectory(_ key: NodeKey) throws(Errno) -> [DirectoryEntry] {
        var entries: [DirectoryEntry] = []
        switch key {
        case .mountRoot:
            let listing = try storeCall { try self.listing() }
            let own = try rootAttributes(listing)
            entries.append(DirectoryEntry(cookie: 1, name: ".", key: key, attributes: own))
            entries.append(DirectoryEntry(cookie: 2, name: "..", key: key, attributes: own))
            for document in listing.order {
                guard let info = listing.documents[document] else { continue }
                let child = NodeKey.wrapper(document, info.root)
                // A document deleted since the listing was read is skipped, not an error.
                guard let attributes = try? attributes(of: child) else { continue }
                entries.append(
                    DirectoryEntry(
                        cookie: cookie(info.root), name: FUSE.FileName(info.name), key: child,
                        attributes: attributes))
            }
        case .wrapper(let document, let id):
            let (record, tree) = try wrapper(document, id)
            guard record.kind == .directory else { throw .notDirectory }
            let own = attributes(record, in: tree)
            entries.append(DirectoryEntry(cookie: 1, name: ".", key: key, attributes: own))
            let parentKey = record.parent.map { NodeKey.wrapper(document, $0) } ?? .mountRoot
            let parentAttributes = (try? attributes(of: parentKey)) ?? own
            entries.append(
                DirectoryEntry(cookie: 2, name: "..", key: parentKey, attributes: parentAttributes))
            for child in tree.children[id] ?? [] {
                guard let childRecord = tree.records[child] else { continue }
                entries.append(
                    DirectoryEntry(
                        cookie: cookie(child), name: FUSE.FileName(childRecord.name),
                        key: .wrapper(document, child), attributes: attributes(childRecord, in: tree)))
            }
        }
        return entries
    }

    private func cookie(_ id: StoreNodeID) -> UInt64 { UInt64(bitPattern: id.rawValue) &+ 2 }

    /// The entries of an open directory after `offset`, from its snapshot.
    private func entries(
        _ node: NodeID, _ handle: FUSE.FileHandle, after offset: UInt64
    ) throws(Errno) -> [DirectoryEntry] {
        let snapshot = state.withLock { state -> [DirectoryEntry]? in
            guard var open = state.directories[handle.rawValue] else { return nil }
            if offset == 0 && open.served { return nil }
            open.served = true
            state.directories[handle.rawValue] = open
            return open.entries
        }
        var entries: [DirectoryEntry]
        if let snapshot {
            entries = snapshot
        } else {
            // No handle (or a rewinddir): list afresh.
            entries = try listDirectory(key(node))
            state.withLock { state in
                state.directories[handle.rawValue]?.entries = entries
            }
        }
        entries.removeAll { $0.cookie <= offset }
        return entries
    }

    public func readdir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: ReplyDirectory
    ) {
        answer(reply) { () throws(Errno) in
            for entry in try entries(node, handle, after: offset) {
                let full = reply.add(
                    ino: entry.attributes.ino, offset: entry.cookie, type: entry.attributes.type,
                    name: entry.name)
                if full { break }
            }
            reply.finish()
        }
    }

    public func readdirplus(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        reply: ReplyDirectoryPlus
    ) {
        answer(reply) { () throws(Errno) in
            for entry in try entries(node, handle, after: offset) {
                let full = reply.add(
                    entry.key, in: table, attributes: entry.attributes, offset: entry.cookie,
                    name: entry.name, attributeTimeout: configuration.attributeTimeout,
                    entryTimeout: configuration.entryTimeout)
                if full { break }
            }
            reply.finish()
        }
    }

    public func releasedir(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, reply: ReplyEmpty
    ) {
        _ = state.withLock { $0.directories.removeValue(forKey: handle.rawValue) }
        reply.ok()
    }

    // MARK: - File system

    public func statfs(_ context: RequestContext, node: NodeID, reply: ReplyStatfs) {
        // Space is the store's: report the filesystem holding the store file, in 4 KiB blocks.
        var st = statvfs()
        let directory = (store.location as NSString).deletingLastPathComponent
        guard statvfs(directory.isEmpty ? "." : directory, &st) == 0, st.f_blocks > 0 else {
            reply.statistics(.plausibleDefault)
            return
        }
        let unit = UInt64(st.f_frsize > 0 ? st.f_frsize : st.f_bsize)
        func blocks(_ count: UInt64) -> UInt64 {
            count.multipliedReportingOverflow(by: unit).partialValue / 4096
        }
        // Some filesystems (btrfs) report no inode counts; file managers want non-zero ones.
        let files = st.f_files > 0 ? UInt64(st.f_files) : 1 << 20
        let free = st.f_files > 0 ? UInt64(st.f_ffree) : 1 << 20
        reply.statistics(
            FileSystemStatistics(
                blockSize: 4096, blocks: blocks(UInt64(st.f_blocks)),
                blocksFree: blocks(UInt64(st.f_bfree)), blocksAvailable: blocks(UInt64(st.f_bavail)),
                files: files, filesFree: free, nameMax: 255))
    }

    // MARK: - Extended attributes

    public func getxattr(
        _ context: RequestContext, node: NodeID, name: String, reply: ReplyXattr
    ) {
        // Only user. names exist; every other probe (security.capability before each write,
        // ACLs and SELinux labels from ls) is answered from memory.
        guard name.hasPrefix("user.") else {
            reply.error(.noData)
            return
        }
        answer(reply) { () throws(Errno) in
            guard case .wrapper(let document, let id) = try key(node) else { throw .noData }
            let (record, _) = try wrapper(document, id)
            guard let value = record.extendedAttributes[name] else { throw .noData }
            reply.value(Array(value))
        }
    }

    public func listxattr(_ context: RequestContext, node: NodeID, reply: ReplyXattr) {
        answer(reply) { () throws(Errno) in
            guard case .wrapper(let document, let id) = try key(node) else {
                reply.names([])
                return
            }
            let (record, _) = try wrapper(document, id)
            reply.names(record.extendedAttributes.keys.sorted())
        }
    }

    // MARK: - Changes: not in this slice

    public func setattr(
        _ context: RequestContext, node: NodeID, changes: SetAttributes, reply: ReplyAttr
    ) { reply.error(.readOnlyFileSystem) }

    public func mknod(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, type: FUSE.FileType,
        permissions: FilePermissions, rdev: UInt64, reply: ReplyEntry
    ) { reply.error(.readOnlyFileSystem) }

    public func mkdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        reply: ReplyEntry
    ) { reply.error(.readOnlyFileSystem) }

    public func unlink(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: ReplyEmpty
    ) { reply.error(.readOnlyFileSystem) }

    public func rmdir(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: ReplyEmpty
    ) { reply.error(.readOnlyFileSystem) }

    public func symlink(
        _ context: RequestContext, target: [UInt8], parent: NodeID, name: FUSE.FileName,
        reply: ReplyEntry
    ) { reply.error(.readOnlyFileSystem) }

    public func rename(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, newParent: NodeID,
        newName: FUSE.FileName, flags: RenameFlags, reply: ReplyEmpty
    ) { reply.error(.readOnlyFileSystem) }

    public func link(
        _ context: RequestContext, node: NodeID, newParent: NodeID, newName: FUSE.FileName,
        reply: ReplyEntry
    ) { reply.error(.readOnlyFileSystem) }

    public func write(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle, offset: UInt64,
        data: [UInt8], info: WriteInfo, reply: ReplyWrite
    ) { reply.error(.readOnlyFileSystem) }

    // `create` answers EROFS rather than the default ENOSYS, which the kernel would remember
    // for the connection.
    public func create(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, permissions: FilePermissions,
        flags: OpenFlags, reply: ReplyCreate
    ) { reply.error(.readOnlyFileSystem) }

    public func setxattr(
        _ context: RequestContext, node: NodeID, name: String, value: [UInt8], flags: XattrFlags,
        reply: ReplyEmpty
    ) { reply.error(.readOnlyFileSystem) }

    public func removexattr(
        _ context: RequestContext, node: NodeID, name: String, reply: ReplyEmpty
    ) { reply.error(.readOnlyFileSystem) }

    // MARK: - Invalidation

    /// Brings the cached tree of `document` up to date if the store has moved on, and tells the
    /// kernel what changed.
    private func revalidate(_ document: DocumentID) throws {
        guard let cached = state.withLock({ $0.trees[document] }) else { return }
        let info = try store.document(document)
        guard info.currentVersion != cached.version else { return }
        let (old, new) = try loadTree(document)
        if let old { invalidate(old, new) }
    }

    /// Called on the observer's thread with other processes' (and our own) store events.
    private func storeChanged(_ events: [StoreEvent]) {
        let documents = Set(events.map(\.document))
        // Saves and conflicts leave the root listing as it is; the rest change names.
        if events.contains(where: { $0.kind != .saved && $0.kind != .conflict }) {
            refreshListing()
        }
        for document in documents {
            guard state.withLock({ $0.trees[document] }) != nil else { continue }
            do {
                let (old, new) = try loadTree(document)
                if let old { invalidate(old, new) }
            } catch {
                logger.warning("cannot refresh \(document): \(error)")
            }
        }
    }

    /// Reads the root listing again and invalidates the names that changed.
    private func refreshListing() {
        let old = state.withLock { state -> RootListing? in
            state.listingGeneration += 1
            defer { state.listing = nil }
            return state.listing
        }
        let new: RootListing
        do {
            new = try listing()
        } catch {
            logger.warning("cannot list the store: \(error)")
            return
        }
        state.withLock { $0.rootChanged = .now }
        guard let notifier = state.withLock({ $0.notifier }) else { return }
        let root = NodeID.root
        for (id, info) in old?.documents ?? [:] where new.documents[id]?.name != info.name {
            let name = FUSE.FileName(info.name)
            if new.documents[id] == nil, let child = table.node(for: .wrapper(id, info.root)) {
                notifier.delete(parent: root, child: child, name: name)
            } else {
                notifier.invalidateEntry(parent: root, name: name)
            }
        }
        for (id, info) in new.documents where old?.documents[id]?.name != info.name {
            // A cached negative entry (none are sent today) or another node under the name.
            notifier.invalidateEntry(parent: root, name: FUSE.FileName(info.name))
        }
        // The root's attributes (nlink, times) and its cached listing.
        notifier.invalidateInode(root)
    }

    /// Tells the kernel which wrappers changed between two trees of a document.
    private func invalidate(_ old: DocumentTree, _ new: DocumentTree) {
        guard old.version != new.version, let notifier = state.withLock({ $0.notifier }) else { return }
        let document = new.document
        func node(_ id: StoreNodeID?) -> NodeID? {
            guard let id else { return .root }
            return table.node(for: .wrapper(document, id))
        }
        func dropName(_ record: NodeRecord, removed: Bool) {
            // The document root's name lives in the root listing, handled there.
            guard record.parent != nil, let parent = node(record.parent) else { return }
            let name = FUSE.FileName(record.name)
            if removed, let child = node(record.id) {
                notifier.delete(parent: parent, child: child, name: name)
            } else {
                notifier.invalidateEntry(parent: parent, name: name)
            }
            notifier.invalidateInode(parent)
        }
        for (id, record) in new.records {
            guard let before = old.records[id] else {
                // Added: its parent's listing, link count and times changed.
                if let parent = node(record.parent) { notifier.invalidateInode(parent) }
                continue
            }
            guard before.version != record.version else { continue }
            if let child = node(id) { notifier.invalidateInode(child) }
            if before.parent != record.parent || before.name != record.name {
                dropName(before, removed: false)
                if let parent = node(record.parent) { notifier.invalidateInode(parent) }
            }
        }
        for (id, record) in old.records where new.records[id] == nil {
            dropName(record, removed: true)
        }
    }

    /// Runs a handler body, answering its error.
    private func answer<R: Reply>(_ reply: R, _ body: () throws(Errno) -> Void) {
        do { try body() } catch { reply.error(error) }
    }
}
