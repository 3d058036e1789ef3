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
public final class DocumentFileSystem: FileSystem, MountRoom {
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
        /// Close-to-open across mounts: a close of a changed file returns once its document is
        /// saved (not durably), so that an open on another mount afterwards sees the change.
        /// Off, a close queues the save for the group committer, which is cheaper; a close of a
        /// file this mount holds a lock on saves at once either way.
        public var closeToOpen = false
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
    /// The store shown.
    public var store: any FileSystemStore { view.store }
    public var configuration: Configuration { view.configuration }
    /// The view tree, the store and the kernel's node table, which every room shares.
    let view: MountView
    /// The last store event before this file system existed: the observer starts after it.
    private let startSequence: Int64
    /// Bytes of small files' writes held in memory now (``Configuration/memoryForSmallFiles``).
    package var memoryForSmallFilesInUse: Int { spillFiles.memoryInUse }
    /// Chunks a change copied from a lower spill layer into the one it wrote, since the mount
    /// began.
    package var chunksCopiedBetweenLayers: Int { spillFiles.chunksCopied }
    /// The XML texts of stored binary property lists (`archives=xml`).
    let texts: PropertyListTexts
    /// Other processes' and mounts' saves, shown.
    let reconciler: Reconciler
    /// Saving: the one save pipeline and the background threads.
    let saving: SavePipeline
    var saveQueue: SaveQueue { saving.saveQueue }
    let conflictCopies: ConflictCopies
    /// The history and the Trash.
    let desktop: DesktopFolders
    let resolver: NodeResolver
    /// Creates, links, removals, renames and moves.
    let names: NameOperations
    /// File locks, shared with every mount of the store.
    let locks: FileLocks

    /// - Parameters:
    ///   - store: the store to show; a store shared with others is fine.
    ///   - configuration: timeouts, save policy and where dirty chunks wait.
    ///   - logger: where store errors are reported.
    public init(
        store: any FileSystemStore, configuration: Configuration = Configuration(),
        logger: Logger = Logger(label: "docfs")
    ) throws {
        startSequence = try store.latestEventSequence()
        view = MountView(store: store, configuration: configuration, logger: logger)
        texts = PropertyListTexts(view: view)
        reconciler = Reconciler(view: view)
        saving = SavePipeline(view: view, texts: texts, reconciler: reconciler)
        conflictCopies = ConflictCopies(view: view, texts: texts, reconciler: reconciler, saving: saving)
        desktop = DesktopFolders(view: view, saving: saving, conflictCopies: conflictCopies)
        resolver = NodeResolver(view: view, desktop: desktop, conflictCopies: conflictCopies)
        names = NameOperations(
            view: view, texts: texts, saving: saving, conflictCopies: conflictCopies, desktop: desktop,
            resolver: resolver)
        locks = FileLocks(view: view, saving: saving, reconciler: reconciler)
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
                view.writeback.store(true, ordering: .relaxed)
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
        // Locks go to the store, which every mount shares, instead of staying in this kernel.
        do {
            try config.enable([.posixLocks, .flockLocks])
        } catch {
            logger.notice("file locks stay local to this mount: \(error)")
        }
        // Lookups and listings in one folder run at once (every handler takes the view lock for
        // what it shares); without it the kernel sends them one at a time per folder.
        do {
            try config.enable(.parallelDirectoryOps)
        } catch {
            logger.notice("FUSE_PARALLEL_DIROPS not available: \(error)")
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
            ) { [weak view] events in
                // Weak: the view's state holds the observer.
                guard let view else { return }
                Reconciler(view: view).storeChanged(events)
            }
            state.withLock { $0.observer = observer }
        } catch {
            logger.error("cannot observe the store for changes: \(error)")
        }
        saving.startSaver()
        saving.startCommitter()
        saving.startCollector()
    }

    public func destroy() {
        let observer = state.withLock { state -> StoreObserver? in
            state.stopping = true
            defer { state.observer = nil }
            return state.observer
        }
        observer?.stop()
        locks.stop()
        saveQueue.stop()
        // A save the committer or the saver is in the middle of (a close's, taken from the
        // pending ones) finishes first: the process may end as soon as this returns, and before,
        // a file copied in just before the unmount was lost with the save it was in.
        saveQueue.threads.wait()
        // Every pending change is saved before the session ends (and the process exits); what
        // cannot be is tried again for a while rather than dropped at once.
        var failed = saving.saveAll(durable: true)
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
            failed = saving.saveAll(durable: true)
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

    /// Saves every document with unsaved changes; returns the documents whose save failed.
    @discardableResult
    public func saveAll(durable: Bool) -> [DocumentID] { saving.saveAll(durable: durable) }

    /// Holds the committer and the quiet-interval saver back, or lets them go again, for tests
    /// that look at what an `fsync` left on disk before its save.
    package func holdBackgroundSaves(_ held: Bool) {
        saveQueue.hold(held)
    }

    // MARK: - Store access

    // MARK: - Nodes

    // MARK: - Attributes

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
            if let virtual = desktop.virtualAtRoot(name, uid: uid) {
                return (virtual, state.withLock { _ in self.attributes(virtual) })
            }
            try ensureListing()
        }
        guard let directory = try resolver.resolve(parent, loadingChildren: true) else {
            let node = try state.withLock { state throws(Errno) -> ViewNode in
                guard let node = state.rootEntries[name] else { throw .noSuchFileOrDirectory }
                return node
            }
            try texts.showAsText(node)
            return (node, state.withLock { _ in self.attributes(node) })
        }
        // A virtual folder lists the store again for a name it does not have (a new version, an
        // item trashed through another mount).
        if desktop.isVirtual(directory), directory.role != nil,
            state.withLock({ _ in directory.children[name] == nil })
        {
            try desktop.refreshVirtual(directory, force: true)
        }
        let (node, attrs) = try state.withLock { state throws(Errno) -> (ViewNode, FileAttributes) in
            guard directory.kind == .directory else { throw .notDirectory }
            guard let found = directory.children[name] else { throw .noSuchFileOrDirectory }
            // The kernel knows a file by one node whatever name it is looked up by.
            let node = found.linkOf ?? found
            return (node, self.attributes(node))
        }
        guard configuration.archivesAsText, node.kind == .regularFile else { return (node, attrs) }
        try texts.showAsText(node)
        return (node, state.withLock { _ in self.attributes(node) })
    }

    public func forget(node: NodeID, lookups: UInt64) { table.forget(node, lookups: lookups) }
    public func batchForget(_ items: [ForgetItem]) { table.forget(items) }

    public func getattr(
        _ context: RequestContext, node: NodeID, handle: FUSE.FileHandle?, reply: consuming ReplyAttr
    ) {
        do throws(Errno) {
            if node == .root { try ensureListing() }
            if configuration.archivesAsText, let file = try resolver.resolve(node) {
                try texts.showAsText(file)
            }
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

extension ViewNode {
    /// Whether the file has writes or a truncation not yet in the store.
    var contentsModified: Bool { contents?.isModified ?? false }
}
