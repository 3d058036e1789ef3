import DocumentEngine
import FUSE
import Foundation
import SystemPackage
import Threading
import VersionedStore

/// The mount's background work: the quiet-interval saver, the committer that group-commits
/// closes, and the collector that thins history.
extension SavePipeline {
    // MARK: - The quiet-interval saver

    func startSaver() {
        let quiet = configuration.quietInterval
        let pause = min(
            0.25,
            max(0.01, Double(quiet.components.seconds) + Double(quiet.components.attoseconds) / 1e18) / 4)
        let queue = saveQueue
        queue.threads.enter()
        let started = startDetachedThread(name: "docfs.saver") { [weak self] in
            defer { queue.threads.leave() }
            while true {
                guard let self, !queue.isStopping else { return }
                self.saveQuietDocuments()
                Thread.sleep(forTimeInterval: pause)
            }
        }
        if !started { queue.threads.leave() }
    }

    private func saveQuietDocuments() {
        let now = ContinuousClock.now
        guard !saveQueue.isHeld else { return }
        let due = state.withLock { state -> [DocumentState] in
            state.documents.values.filter { document in
                (document.dirty || document.lastError != nil)
                    && now - document.lastChange >= configuration.quietInterval
            }
        }
        guard !due.isEmpty else { return }
        let failed = Set(save(group: due, durable: true))
        for document in due where failed.contains(document.id) {
            // Retried after the next quiet interval; close and fsync report it meanwhile.
            state.withLock { _ in document.lastChange = ContinuousClock.now }
        }
    }

    // MARK: - Group commit of closes

    /// Hands the document's save to the committer (group commit), which commits it within a few
    /// milliseconds: a save point (a close, a rename onto a wrapper's name) returns without
    /// waiting for the store. With `reporting`, returns the error of a save of the document that
    /// failed since the last report, once (what close(2) returns); its changes stay pending and
    /// are saved again.
    @discardableResult
    func commitSoon(_ document: DocumentState, reporting: Bool = false) -> Errno? {
        saveQueue.askForSave(document.id)
        guard reporting else { return nil }
        return state.withLock { _ -> Errno? in
            defer { document.lastError = nil }
            return document.lastError
        }
    }

    /// How long the save of an `fsync` that the store logged may wait for more: fsx's fsyncs
    /// come every few milliseconds, and a save per fsync (each a durable commit) took the second
    /// core and the disk from them (20,000 operations in 2.24–2.58 s against 1.69–1.85 s).
    static let loggedSaveDelay: Duration = .milliseconds(20)

    /// Saves what closes and logged fsyncs asked for, in the background: the close returns at
    /// once, and the closes that come while a commit runs, or within two milliseconds of the
    /// first, are committed together as one store transaction (``save(group:durable:)``), with
    /// every logged document. A logged document alone waits up to ``loggedSaveDelay``.
    func startCommitter() {
        let queue = saveQueue
        queue.threads.enter()
        let started = startDetachedThread(name: "docfs.committer") { [weak self] in
            defer { queue.threads.leave() }
            // Closes within two milliseconds of the first are committed with it.
            while let group = queue.nextGroup(gathering: .milliseconds(2)) {
                guard let self else { return }
                if !group.isEmpty { self.save(group: self.documents(group), durable: false) }
            }
        }
        if !started { queue.threads.leave() }
    }

    /// The documents the queue named that the mount still shows: one removed since (deleted,
    /// or merged into another by a move) has nothing left to save.
    func documents(_ ids: [DocumentID]) -> [DocumentState] {
        state.withLock { state in ids.compactMap { state.documents[$0] } }
    }

    // MARK: - History that thins itself

    /// Applies the store's retention policy when it is due, a minute after mounting and then
    /// every few minutes, on a thread of its own: saves never wait for it, and the versions this
    /// mount still reads from are protected.
    func startCollector() {
        guard let interval = configuration.collectionInterval, !configuration.readOnly else { return }
        let queue = saveQueue
        queue.threads.enter()
        let started = startDetachedThread(name: "docfs.collector") { [weak self] in
            defer { queue.threads.leave() }
            var next = ContinuousClock.now + min(interval, .seconds(60))
            while true {
                guard let self, !queue.isStopping else { return }
                if ContinuousClock.now >= next {
                    next = ContinuousClock.now + min(interval, .seconds(600))
                    self.collectIfDue(every: interval)
                }
                Thread.sleep(forTimeInterval: 0.5)
            }
        }
        if !started { queue.threads.leave() }
    }

    func collectIfDue(every interval: Duration) {
        let protected = versionsInUse()
        do {
            if let report = try store.collectGarbageIfDue(every: interval, protecting: protected) {
                logger.info(
                    "retention: \(report.versionsRemoved) versions and \(report.documentsRemoved) deleted documents dropped, \(report.bytesFreed) bytes freed"
                )
            }
        } catch {
            logger.warning("retention: \(error)")
        }
    }

    /// The versions this mount reads from: every document's base and every file's contents base.
    func versionsInUse() -> Set<VersionID> {
        state.withLock { state in
            var versions = Set(state.documents.values.map(\.base))
            for node in state.nodes.values {
                if let version = node.contents?.base.version { versions.insert(version) }
            }
            for file in state.files.values {
                if let version = file.snapshot?.version { versions.insert(version) }
            }
            return versions
        }
    }

}
