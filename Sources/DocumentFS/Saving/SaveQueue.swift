import DocumentEngine
import Threading

#if canImport(Glibc)
    import Glibc
#endif

/// The saves the mount's background threads owe: documents a close (or a rename onto a wrapper's
/// name) asked to save, and documents whose changes an `fsync` logged. The committer takes them in
/// groups (``SavePipeline/startCommitter()``); the saver and the collector only look at
/// whether the mount is stopping or its background saves are held.
///
/// Its own monitor (a leaf of the lock order) guards it, and is the committer's doorbell: a
/// request handler adds a document and returns, and the committer wakes.
final class SaveQueue: Sendable {
    private struct Pending: Sendable {
        var closes: Set<DocumentID> = []
        var logged: [DocumentID: ContinuousClock.Instant] = [:]
        /// The committer and the quiet-interval saver wait (``hold(_:)``).
        var held = false
        var stopping = false
    }

    private let pending = Monitor(Pending())
    /// The saver, the committer and the collector while they run.
    let threads = WorkCount()

    /// How long the save of an `fsync` that the store logged may wait for more.
    let loggedDelay: Duration

    init(loggedDelay: Duration) { self.loggedDelay = loggedDelay }

    /// A close or a rename asks for the document's save.
    func askForSave(_ document: DocumentID) {
        pending.withLock { _ = $0.closes.insert(document) }
    }

    /// An `fsync` logged the document's changes: the committer saves them within
    /// ``loggedDelay``, with whatever a close asked for meanwhile.
    func logged(_ document: DocumentID) {
        pending.withLock { pending in
            if pending.logged[document] == nil { pending.logged[document] = .now }
            // What an earlier close asked to save is in the logged record: its save may wait as a
            // logged one does, and take in the next safe-saves' records too.
            pending.closes.remove(document)
        }
    }

    /// The document was saved whole: no close needs its save any more.
    func saved(_ id: DocumentID) {
        pending.withLock(wake: false) { _ = $0.closes.remove(id) }
    }

    /// Forgets every pending save: the caller saves every document itself.
    func takeAll() {
        pending.withLock(wake: false) { pending in
            pending.closes = []
            pending.logged = [:]
        }
    }

    /// Holds the committer and the saver back, or lets them go.
    func hold(_ held: Bool) { pending.withLock { $0.held = held } }

    var isHeld: Bool { pending.withLock(wake: false) { $0.held } }

    /// Ends the background threads' loops (each at its next look).
    func stop() { pending.withLock { $0.stopping = true } }

    var isStopping: Bool { pending.withLock(wake: false) { $0.stopping } }

    /// For the committer: waits until closes asked for saves, a logged save is due, the mount
    /// stops, or a quarter of a second passes. Returns the documents to save together (empty
    /// after a timeout, or while held), or nil once the mount stops.
    ///
    /// Closes that come within `gathering` of the first one are taken with it.
    func nextGroup(gathering: Duration) -> [DocumentID]? {
        let most = Duration.milliseconds(250)
        let ready = { (pending: Pending) -> Bool in
            pending.stopping || (!pending.held && (!pending.closes.isEmpty || self.loggedDue(pending)))
        }
        let timeout = pending.withLock(wake: false) { pending -> Duration in
            guard let oldest = pending.logged.values.min() else { return most }
            return min(most, max(.zero, oldest + loggedDelay - .now))
        }
        let (stopping, closes) =
            pending.wait(until: ready, timeout: timeout) { ($0.stopping, !$0.closes.isEmpty) } ?? (
                false, false
            )
        if stopping { return nil }
        if closes, gathering > .zero { usleep(UInt32(gathering / .microseconds(1))) }
        return pending.withLock(wake: false) { pending -> [DocumentID]? in
            guard !pending.stopping else { return nil }
            guard !pending.held, !pending.closes.isEmpty || loggedDue(pending) else { return [] }
            let group = pending.closes.union(pending.logged.keys)
            pending.closes = []
            pending.logged = [:]
            return Array(group)
        }
    }

    private func loggedDue(_ pending: Pending) -> Bool {
        let now = ContinuousClock.now
        return pending.logged.values.contains { now - $0 >= loggedDelay }
    }
}
