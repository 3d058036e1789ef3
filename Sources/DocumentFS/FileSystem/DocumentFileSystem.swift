import DocumentEngine
import FUSE
import Foundation
import Logging
import Synchronization
import SystemPackage
import Threading
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// The file system that shows a document store: the mount root lists the store's live
/// documents (a package document is a directory, a flat document a regular file), and inside a
/// package its wrappers are directories, regular files and symbolic links.
///
/// - **Lazy reads.** Listings, `stat`, `readlink` and xattrs come from wrapper records (read per
///   document on first use); `read` asks the store for exactly the chunks it needs.
/// - **Incremental saves.** Writes collect in per-file layers of dirty chunks (kept in unnamed
///   local files, or in memory for small files, within a budget). A save sends the document's changed records and only the
///   dirty chunks to the store as one atomic version. Save points: `fsync` (durable before it
///   returns), the close of a dirty file, a rename onto a wrapper's name, a quiet interval after
///   the last change, and unmount. A save's error is what `close`/`fsync` return.
/// - **Editors.** Scratch files (``ScratchNames``) are real files that are never saved; renaming
///   one onto a wrapper's name publishes it in one save.
/// - **Stable inode numbers**: the store node id plus one (the mount root is 1).
/// - **Consistency.** A ``StoreObserver`` notices other processes' saves and invalidates the
///   kernel's caches; `open` revalidates (close-to-open). With the kernel's writeback cache, which
///   keeps sizes and times itself, a file changed elsewhere gets a new kernel inode instead
///   (``Configuration/writebackCache``). A save based on an older version than
///   the store's is applied on top when it touches other wrappers, and kept as a conflict
///   version otherwise.
///
/// Handlers block on the store: they run on libfuse's worker threads, never on Swift's
/// cooperative pool.
public final class DocumentFileSystem: FileSystem {
    /// Tunables.
    public struct Configuration: Sendable {
        /// How long the kernel may cache attributes. Long: every change the kernel did not make
        /// itself (another process's save, a listing's news) is invalidated, so a long timeout
        /// saves round trips without showing stale attributes.
        public var attributeTimeout: Duration = .seconds(60)
        /// How long the kernel may cache names, and that a name is missing; long for the same reason.
        public var entryTimeout: Duration = .seconds(60)
        /// How often the store's event log is polled for other processes' changes.
        public var pollInterval: Duration = .milliseconds(100)
        /// A document with unsaved changes is saved once this long has passed without a change.
        public var quietInterval: Duration = .seconds(1)
        /// Where written chunks wait for their save (unnamed files); nil: beside the store file,
        /// or the system's temporary directory for stores that are not local files.
        public var spillDirectory: String?
        /// Bytes written to small files (at most 256 KiB into them) are kept in memory rather
        /// than in spill files, up to this many bytes across the mount; 0 puts every written
        /// byte in a spill file.
        public var memoryForSmallFiles = 16 << 20
        /// Names of files that are never saved.
        public var scratchNames = ScratchNames.standard
        /// Answer every change with `EROFS`.
        public var readOnly = false
        /// Who saved, in the store's version history.
        public var origin = "docfs mount"
        /// How often the store's retention policy is applied in the background (by whichever
        /// process using the store finds it due first); nil never.
        public var collectionInterval: Duration? = .seconds(3600)
        /// Show binary property lists (keyed archives included) as XML text, and store text
        /// written to them as binary property lists again (`-o archives=xml`).
        public var archivesAsText = false
        /// Let the kernel cache writes and merge them (`FUSE_WRITEBACK_CACHE`). The kernel then
        /// keeps files' sizes and times itself, so a file changed elsewhere is given a new
        /// kernel inode (``NodeTable/retire(_:)``) instead of new attributes.
        public var writebackCache = true
        /// How long the end of the session (`destroy`) tries again (after 1 s, 2 s, 4 s, then
        /// every 10 s) to save documents whose save fails (a full disk, a store that cannot be
        /// reached) before it gives their changes up; zero: one try.
        public var finalSaveRetry: Duration = .zero
        /// Called at the end of the session with the documents whose changes are still unsaved
        /// (``DocumentFileSystem/unsavedDocuments``) each time they are tried and fail, and with
        /// none once they are saved after failing.
        public var unsavedChanged: (@Sendable ([String]) -> Void)?
        public init() {}
    }

    /// The store shown.
    public let store: any FileSystemStore
    public let configuration: Configuration
    let logger: Logger
    let table: NodeTable<UInt64>
    let state = Locked(.view, State())
    /// The last store event before this file system existed: the observer starts after it.
    private let startSequence: Int64
    /// Owner of the mount root, from the store file when it is a local file.
    let rootOwner: (uid: UInt32, gid: UInt32)
    /// Where written chunks are kept until saved.
    let spillFiles: SpillFiles
    /// Bytes of small files' writes held in memory now (``Configuration/memoryForSmallFiles``).
    package var memoryForSmallFilesInUse: Int { spillFiles.memoryInUse }
    /// Chunks a change copied from a lower spill layer into the one it wrote, since the mount
    /// began.
    package var chunksCopiedBetweenLayers: Int { spillFiles.chunksCopied }
    /// The folder of the store file; empty for a store that is not a local file.
    let storeDirectory: String
    let chunkSize: Int
    /// Whether the kernel took the writeback cache in `INIT`.
    let writeback = Atomic<Bool>(false)
    /// The XML texts of stored binary property lists (`archives=xml`).
    let textViews = TextViews()
    /// The saves the committer owes, and the background threads' lifetime.
    let saveQueue = SaveQueue(loggedDelay: DocumentFileSystem.loggedSaveDelay)
    /// File systems made by this process, to tell their origins apart.
    private static let instances = Atomic<Int>(0)
    /// Who saved, in the store's history: unique to this mount, so its own events are told
    /// apart from other processes' (another mount of the same store included).
    let origin: String

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
    }

    /// One readdir entry. `cookie` is the offset that continues *after* it.
    struct DirectoryEntry {
        var cookie: UInt64
        var name: FUSE.FileName
        var ino: UInt64
        var attributes: FileAttributes
    }

    struct OpenDirectory {
        var ino: UInt64
        /// Taken at the first readdir, so that opening a directory (to fsync it, say) costs
        /// nothing however big it is.
        var entries: [DirectoryEntry]?
        /// Set once a readdir served this snapshot; a later offset-0 read (rewinddir) rebuilds.
        var served = false
    }

    struct State {
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
        /// A signature of each directory's last listing, for `keep_cache` on `opendir`.
        var listedGenerations: [UInt64: UInt64] = [:]
        var rootChanged: Timespec = .now
        /// Counts this mount's changes to the set of documents and their names (each
        /// ``changingRoot(_:)``, and an install) and to the conflict entries it shows, so that ``refreshListing()`` can tell that a store listing it took is older
        /// than the state it is about to reconcile with it.
        var rootGeneration: UInt64 = 0
        /// This mount's changes of the root's documents between their store transaction and
        /// the view's update (``changingRoot(_:)``): a listing read meanwhile may show the commit
        /// before the view does, so ``refreshListing()`` applies none while any is in flight.
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

    /// - Parameters:
    ///   - store: the store to show; a store shared with others is fine.
    ///   - configuration: timeouts, save policy and where dirty chunks wait.
    ///   - logger: where store errors are reported.
    public init(
        store: any FileSystemStore, configuration: Configuration = Configuration(),
        logger: Logger = Logger(label: "docfs")
    ) throws {
        self.store = store
        self.configuration = configuration
        self.logger = logger
        chunkSize = store.chunkSize
        let instance = Self.instances.add(1, ordering: .relaxed).newValue
        let host = ProcessInfo.processInfo.hostName
        origin = "\(configuration.origin) (\(host) pid \(getpid())\(instance > 1 ? ".\(instance)" : ""))"
        startSequence = try store.latestEventSequence()
        var st = stat()
        if stat(store.location, &st) == 0 {
            rootOwner = (st.st_uid, st.st_gid)
        } else {
            rootOwner = (getuid(), getgid())
        }
        // Only a store that is a local file has a folder (corelibs' deletingLastPathComponent traps
        // on a name without a slash, such as a store in memory).
        storeDirectory =
            store.location.hasPrefix("/") ? (store.location as NSString).deletingLastPathComponent : ""
        var isDirectory: ObjCBool = false
        if let given = configuration.spillDirectory {
            spillFiles = SpillFiles(directory: given, memoryBudget: configuration.memoryForSmallFiles)
        } else if !storeDirectory.isEmpty,
            FileManager.default.fileExists(atPath: storeDirectory, isDirectory: &isDirectory),
            isDirectory.boolValue, Glibc.access(storeDirectory, W_OK) == 0
        {
            spillFiles = SpillFiles(
                directory: storeDirectory, memoryBudget: configuration.memoryForSmallFiles)
        } else {
            spillFiles = SpillFiles(
                directory: NSTemporaryDirectory(), memoryBudget: configuration.memoryForSmallFiles)
        }
        let forgotten = ForgetRelay()
        table = NodeTable(root: mountRootInode) { ino, _ in forgotten.target?.forgotten(ino) }
        forgotten.connect(self)
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
        if configuration.writebackCache {
            do {
                try config.enable(.writebackCache)
                writeback.store(true, ordering: .relaxed)
            } catch {
                logger.notice("the kernel's writeback cache is not available: \(error)")
            }
        }
        // The kernel would otherwise ask for security.capability before every write(2) (a
        // round trip each, a third of a 4 KiB random write's time); only user. attributes exist
        // here, so only the set-ID bits need clearing, which this filesystem then does.
        do {
            try config.enable(.handleKillPrivV2)
        } catch {
            logger.notice("FUSE_HANDLE_KILLPRIV_V2 not available: \(error)")
        }
        // The kernel keeps each file's ACL (here always none, `system.posix_acl_*` answering
        // ENODATA) instead of asking for it again at every `ls -l` of the file.
        do {
            try config.enable(.posixACL)
        } catch {
            logger.notice("FUSE_POSIX_ACL not available: \(error)")
        }
        // Contents come from SQLite, not from a descriptor: splice cannot help
        // (docs/design/fuse-notes.md §2.1).
        config.disable([.spliceRead, .spliceWrite, .spliceMove])
        // The observer and the saver start with the session, not with the object, so that a
        // daemonizing caller can fork between mount and start without a thread in flight.
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
        startSaver()
        startCommitter()
        startCollector()
    }

    public func destroy() {
        let observer = state.withLock { state -> StoreObserver? in
            state.stopping = true
            defer { state.observer = nil }
            return state.observer
        }
        observer?.stop()
        saveQueue.stop()
        // A save the committer or the saver is in the middle of (a close's, taken from the
        // pending ones) finishes first: the process may end as soon as this returns, and before,
        // a file copied in just before the unmount was lost with the save it was in.
        saveQueue.threads.wait()
        // Every pending change is saved before the session ends (and the process exits); what
        // cannot be is tried again for a while rather than dropped at once.
        var failed = saveAll(durable: true)
        guard !failed.isEmpty else { return }
        let clock = ContinuousClock()
        let giveUp = clock.now + configuration.finalSaveRetry
        var pause = 1.0
        while !failed.isEmpty {
            let (unsaved, first) = state.withLock { state in
                let unsaved = failed.compactMap { state.documents[$0] }.map { document in
                    "\(document.info.name): \(document.lastError.map { "\($0)" } ?? "the save failed")"
                }
                defer { state.unsaved = unsaved }
                return (unsaved, state.unsaved.isEmpty)
            }
            configuration.unsavedChanged?(unsaved)
            guard clock.now < giveUp else { break }
            if first {
                logger.error(
                    "cannot save \(unsaved.joined(separator: "; ")); trying again, at most 10 s apart, for up to \(configuration.finalSaveRetry)"
                )
            }
            Thread.sleep(forTimeInterval: pause)
            pause = min(pause * 2, 10)
            failed = saveAll(durable: true)
        }
        if failed.isEmpty {
            state.withLock { $0.unsaved = [] }
            configuration.unsavedChanged?([])
            logger.notice("saved everything after trying again")
        } else {
            logger.error(
                "gave up saving \(state.withLock { $0.unsaved }.joined(separator: "; ")): those changes are lost"
            )
        }
    }

    /// The documents whose changes the end of the session could not save (each as its name and
    /// why): empty unless ``destroy()`` gave up on them, or is still trying.
    public var unsavedDocuments: [String] { state.withLock { $0.unsaved } }

    /// Holds the committer and the quiet-interval saver back, or lets them go again, for tests
    /// that look at what an `fsync` left on disk before its save.
    package func holdBackgroundSaves(_ held: Bool) {
        saveQueue.hold(held)
    }

    /// Saves every document with unsaved changes; returns the documents whose save failed.
    @discardableResult
    public func saveAll(durable: Bool) -> [DocumentID] {
        saveQueue.takeAll()
        let pending = state.withLock { state in
            state.documents.values.filter { $0.dirty || $0.lastError != nil }
        }
        let failed = save(group: pending, durable: durable)
        for document in pending where failed.contains(document.id) {
            logger.error("cannot save \(document.info.name)")
        }
        return failed
    }

    // MARK: - Store access

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

    /// Runs `body`, a change of the root's documents (a create, a rename, a removal, a move to or
    /// from the Trash or a package, keeping a conflict), as in flight until it returns. Its
    /// store transaction commits before the view shows it; a root listing read in between
    /// would show the document already there (and the view would then install it twice: two
    /// states for one document, one of them behind a name the store no longer has) or already
    /// gone. ``refreshListing()`` applies no listing while a change is in flight, and the
    /// generation each one bumps at its end tells it that a listing it read is older.
    func changingRoot<T>(_ body: () throws(Errno) -> T) throws(Errno) -> T {
        state.withLock { $0.rootChangesInFlight += 1 }
        defer {
            state.withLock { state in
                state.rootChangesInFlight -= 1
                state.rootGeneration &+= 1
            }
        }
        return try body()
    }

    /// Reads the root listing from the store unless it was read.
    func ensureListing() throws(Errno) {
        if state.withLock({ $0.listed }) { return }
        let infos = renamingReserved(try storeCall { try store.documents() })
        let records = try storeCall { try rootRecords(of: infos) }
        let roots = infos.compactMap { info in records[info.id].map { (info, $0) } }
        let conflicts = fetchConflicts(
            roots: Dictionary(infos.map { ($0.id, $0.root) }) { first, _ in first })
        state.withLock { state in
            guard !state.listed else { return }
            for (info, record) in roots where state.documents[info.id] == nil {
                _ = install(&state, info: info, rootRecord: record)
            }
            if let conflicts {
                _ = reconcileConflicts(&state, versions: conflicts.versions, records: conflicts.records)
            }
            state.listed = true
        }
    }

    /// The root records of `infos` at their current versions, in one store call. A document
    /// whose root cannot be read is left out (and logged), not the others.
    func rootRecords(of infos: [DocumentInfo]) throws -> [DocumentID: NodeRecord] {
        guard !infos.isEmpty else { return [:] }
        let results = try store.nodes(infos.map { NodeLookup($0.root, at: $0.currentVersion) })
        var records: [DocumentID: NodeRecord] = [:]
        for (info, result) in zip(infos, results) {
            switch result {
            case .success(let record?): records[info.id] = record
            case .success(nil): continue
            case .failure(let error): logger.warning("cannot read the document \(info.name): \(error)")
            }
        }
        return records
    }

    /// A document's state and node at the root, from its listing and root record.
    func install(_ state: inout State, info: DocumentInfo, rootRecord: NodeRecord) -> DocumentState {
        let node = makeNode(
            storeID: info.root, document: info.id, record: rootRecord, name: FUSE.FileName(info.name))
        node.atMountRoot = true
        let document = DocumentState(info: info, root: node)
        state.documents[info.id] = document
        state.rootGeneration &+= 1
        state.nodes[node.ino] = node
        if let shown = state.rootEntries[node.name], let conflict = conflictEntry(&state, of: shown) {
            // A document keeps its name: a conflict entry that had it is no longer shown.
            dropConflict(&state, conflict)
        }
        if state.rootEntries[node.name] == nil { state.rootEntries[node.name] = node }
        return document
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

    /// Reads a document's wrapper records unless they were read.
    func ensureLoaded(_ document: DocumentState) throws(Errno) {
        if state.withLock({ _ in document.isLoaded }) { return }
        let version = state.withLock { _ in document.base }
        let records = try storeCall { try store.nodes(of: document.id, at: version) }
        let countedFolders = state.withLock { state -> Bool in
            guard !document.isLoaded else { return false }
            attachTree(&state, document, records: records, version: version)
            return document.root.subdirectoryCount > 0
        }
        // Until now the root's link count was 2, its folders unknown; the kernel may hold that.
        if countedFolders { attributesChanged(document.root) }
    }

    /// Builds the node tree of a freshly read document.
    private func attachTree(
        _ state: inout State, _ document: DocumentState, records: [NodeRecord], version: VersionID
    ) {
        var byID: [StoreNodeID: ViewNode] = [document.info.root: document.root]
        var committed: [StoreNodeID: NodeRecord] = [:]
        for record in records {
            committed[record.id] = record
            if record.id == document.info.root {
                // The node at the root may already carry unsaved changes (chmod, a write).
                if document.root.persistAs == record.id && !document.dirty && !document.root.contentsModified
                {
                    document.root.record = record
                }
                continue
            }
            let node = makeNode(
                storeID: record.id, document: document.id, record: record, name: FUSE.FileName(record.name))
            byID[record.id] = node
            if record.linkOf == nil { state.nodes[node.ino] = node }
        }
        for record in records where record.id != document.info.root {
            guard let node = byID[record.id], let parentID = record.parent, let parent = byID[parentID] else {
                continue
            }
            node.parent = parent
            parent.children[node.name] = node
        }
        Self.joinLinks(records, byID)
        document.committed = committed
        document.base = version
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

    // MARK: - Nodes

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

    /// Resolves a kernel node, reading its document's tree first when it is a directory whose
    /// children are asked for.
    func resolve(_ id: NodeID, loadingChildren: Bool = false) throws(Errno) -> ViewNode? {
        let (node, document) = try state.withLock { state throws(Errno) -> (ViewNode?, DocumentState?) in
            let node = try self.node(&state, id)
            return (node, node.flatMap { self.document(&state, of: $0) })
        }
        if loadingChildren, let document { try ensureLoaded(document) }
        if loadingChildren, let node, isVirtual(node) {
            try refreshVirtual(node, force: false)
        } else if loadingChildren, let node, node.conflict != nil {
            try ensureConflictLoaded(node)
        }
        return node
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

    // MARK: - Attributes

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

    // MARK: - Names

    public func lookup(
        _ context: RequestContext, parent: NodeID, name: FUSE.FileName, reply: consuming ReplyEntry
    ) {
        do throws(Errno) {
            let found: ViewNode
            let attrs: FileAttributes
            do throws(Errno) {
                (found, attrs) = try child(named: name, of: parent, uid: context.uid)
            } catch {
                guard error == .noSuchFileOrDirectory else { throw error }
                // The kernel may remember that the name is missing (editors and shells probe many
                // names): a name that appears through anyone but the kernel (another process's
                // save, a listing) is invalidated by name, as changed names are.
                reply.negative(timeout: configuration.entryTimeout)
                return
            }
            entry(reply, found, attrs)
        } catch { reply.error(error) }
    }

    /// The node named `name` in the directory `parent`, with its attributes.
    func child(named name: FUSE.FileName, of parent: NodeID, uid: UInt32) throws(Errno) -> (
        ViewNode, FileAttributes
    ) {
        try checkLength(name)
        if parent == .root {
            if let virtual = virtualAtRoot(name, uid: uid) {
                return (virtual, state.withLock { _ in self.attributes(virtual) })
            }
            try ensureListing()
        }
        guard let directory = try resolve(parent, loadingChildren: true) else {
            let node = try state.withLock { state throws(Errno) -> ViewNode in
                guard let node = state.rootEntries[name] else { throw .noSuchFileOrDirectory }
                return node
            }
            try showAsText(node)
            return (node, state.withLock { _ in self.attributes(node) })
        }
        // A virtual folder lists the store again for a name it does not have (a new version, an
        // item trashed through another mount).
        if isVirtual(directory), directory.role != nil,
            state.withLock({ _ in directory.children[name] == nil })
        {
            try refreshVirtual(directory, force: true)
        }
        let (node, attrs) = try state.withLock { state throws(Errno) -> (ViewNode, FileAttributes) in
            guard directory.kind == .directory else { throw .notDirectory }
            guard let found = directory.children[name] else { throw .noSuchFileOrDirectory }
            // The kernel knows a file by one node whatever name it is looked up by.
            let node = found.linkOf ?? found
            return (node, self.attributes(node))
        }
        guard configuration.archivesAsText, node.kind == .regularFile else { return (node, attrs) }
        try showAsText(node)
        return (node, state.withLock { _ in self.attributes(node) })
    }

    public func forget(node: NodeID, lookups: UInt64) { table.forget(node, lookups: lookups) }
    public func batchForget(_ items: [ForgetItem]) { table.forget(items) }

    public func getattr(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle?, reply: consuming ReplyAttr
    ) {
        do throws(Errno) {
            if node == .root { try ensureListing() }
            if configuration.archivesAsText, let file = try resolve(node) { try showAsText(file) }
            let attrs = try state.withLock { state throws(Errno) in
                guard let n = try self.node(&state, node) else { return rootAttributes(&state) }
                return attributes(n)
            }
            reply.attributes(attrs, timeout: configuration.attributeTimeout)
        } catch { reply.error(error) }
    }

    public func readlink(_ context: RequestContext, node: NodeID, reply: consuming ReplyReadlink) {
        do throws(Errno) {
            let target = try state.withLock { state throws(Errno) -> String in
                guard let n = try self.node(&state, node), n.kind == .symbolicLink,
                    let target = n.record.linkTarget
                else { throw .invalidArgument }
                return target
            }
            reply.target(target)
        } catch { reply.error(error) }
    }

    // MARK: - File system

    public func statfs(_ context: RequestContext, node: NodeID, reply: consuming ReplyStatfs) {
        // Space is the store's: report the filesystem holding the store file, in 4 KiB blocks.
        var st = statvfs()
        // A store that is no local file (on a server, in memory) has no disk to report.
        guard !storeDirectory.isEmpty, statvfs(storeDirectory, &st) == 0, st.f_blocks > 0 else {
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
}

/// Lets the node table's forget callback reach the file system created after it.
private final class ForgetRelay: Sendable {
    private struct Reference { weak var fileSystem: DocumentFileSystem? }
    private let reference = Mutex(Reference())

    var target: DocumentFileSystem? { reference.withLock { $0.fileSystem } }

    func connect(_ fileSystem: DocumentFileSystem) { reference.withLock { $0.fileSystem = fileSystem } }
}

extension ViewNode {
    /// Whether the file has writes or a truncation not yet in the store.
    var contentsModified: Bool { contents?.isModified ?? false }
}
