import Foundation
import Synchronization

/// Delivers a store's events — saves, creations, renames, deletions by this or any other process —
/// to a handler on a dedicated thread, never on a caller's or a request handler's thread.
///
/// It polls the store's event log (for SQLite, one indexed read of the latest sequence number per
/// interval), so it works across processes without a server. A store that pushes notifications
/// (``StoreChangeNotifying``, e.g. PostgreSQL's LISTEN/NOTIFY) wakes it at once instead, and it
/// polls only every ``notifiedPollInterval`` in case a notification was lost.
public final class StoreObserver: Sendable {
    /// How often a store that notifies is polled anyway: a notification sent while the listening
    /// connection was down is lost, and the poll finds its event.
    public static let notifiedPollInterval: Duration = .seconds(1)

    private let store: any DocumentStore
    private let interval: Duration
    private let handler: @Sendable ([StoreEvent]) -> Void
    private let failure = Mutex<String?>(nil)
    private let stopped = Atomic<Bool>(false)

    /// Starts observing events after `sequence` (the latest when nil), polling every `interval`,
    /// or every `notifiedInterval` when the store notifies.
    public init(
        store: any DocumentStore, after sequence: Int64? = nil, interval: Duration = .milliseconds(100),
        notifiedInterval: Duration = StoreObserver.notifiedPollInterval,
        handler: @escaping @Sendable ([StoreEvent]) -> Void
    ) throws {
        self.store = store
        self.interval = interval
        self.handler = handler
        let start = try sequence ?? store.latestEventSequence()
        let pause = Double(interval.components.seconds) + Double(interval.components.attoseconds) / 1e18
        // The thread holds the observer only while polling, so an observer nobody stops is still
        // freed (and stops) when its last owner lets go.
        let notifying = store as? any StoreChangeNotifying
        let thread = Thread { [weak self] in
            // Taken before the first poll, so a change committed during that poll still ends the
            // next wait.
            var generation = notifying?.changeGeneration ?? 0
            var last = start
            while let observer = self, !observer.stopped.load(ordering: .sequentiallyConsistent) {
                last = observer.poll(after: last)
                _ = consume observer
                if let notifying {
                    generation = notifying.waitForChange(after: generation, timeout: notifiedInterval)
                } else {
                    Thread.sleep(forTimeInterval: pause)
                }
            }
        }
        thread.name = "docfs.store-observer"
        thread.start()
    }

    deinit { stop() }

    /// Stops observing; no handler call starts after this returns.
    public func stop() {
        stopped.store(true, ordering: .sequentiallyConsistent)
    }

    /// The last error the poller met, if any (it keeps polling: a busy or briefly unreachable
    /// store is retried).
    public var lastError: String? { failure.withLock { $0 } }

    /// Delivers the events after `last`; returns the newest sequence seen.
    private func poll(after last: Int64) -> Int64 {
        do {
            defer { failure.withLock { $0 = nil } }
            guard try store.latestEventSequence() > last else { return last }
            let events = try store.events(after: last)
            if !events.isEmpty && !stopped.load(ordering: .sequentiallyConsistent) { handler(events) }
            return events.last?.sequence ?? last
        } catch {
            failure.withLock { $0 = String(describing: error) }
            return last
        }
    }
}

/// A store that tells its observers when it may have changed, so they need not poll often.
public protocol StoreChangeNotifying: DocumentStore {
    /// A counter that grows whenever the store may have a new event (any process's save, create,
    /// rename or delete), and whenever notifications may have been missed (a reconnection).
    /// Reading it starts listening if the store was not yet.
    var changeGeneration: UInt64 { get }
    /// Blocks until ``changeGeneration`` exceeds `generation` or `timeout` passes; returns the
    /// generation then.
    func waitForChange(after generation: UInt64, timeout: Duration) -> UInt64
}

extension DocumentStore {
    /// The store's events after now, as an async sequence, until the consumer stops iterating.
    public func changes(interval: Duration = .milliseconds(100)) throws -> AsyncStream<StoreEvent> {
        let (stream, continuation) = AsyncStream<StoreEvent>.makeStream()
        let observer = try StoreObserver(store: self, interval: interval) { events in
            for event in events { continuation.yield(event) }
        }
        continuation.onTermination = { _ in observer.stop() }
        return stream
    }
}
