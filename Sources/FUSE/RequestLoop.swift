import CFuse3
import Synchronization
import Threading

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The session's workers: each reads a request from the device and handles it, and one more
/// is started when none is idle, up to a limit (as libfuse's `fuse_session_loop_mt` does).
///
/// Not libfuse's loop, because of how that one ends: it stops its other workers with
/// `pthread_cancel` while they sleep in `read(2)`, and a worker whose read has just reported
/// how the connection ended is inside libfuse's `perror`, holding stdio's stderr lock. A
/// worker cancelled there leaves the lock held, and the process's next write to stderr (a
/// log line) hangs forever. The kernel answers every blocked read once the connection is gone,
/// so here no worker is cancelled: the session's end makes the connection go (unmount, then
/// abort) and then ``join(abort:)`` collects them.
final class RequestLoop: Sendable {
    private struct State {
        var workers: [pthread_t] = []
        /// How the first worker to stop saw the connection end (0: unmounted or exited).
        var result: Int32?
    }

    private let handle: SessionHandle
    private var session: OpaquePointer { handle.pointer }
    private let maxWorkers: Int
    private let threadName: String
    private let state = Monitor(State())
    /// Workers started or being started (counted before their thread exists), and of those the
    /// ones not busy with a request: atomics, since every request changes them twice.
    private let started = Atomic<Int>(0)
    private let idle = Atomic<Int>(0)

    init(session: OpaquePointer, maxWorkers: Int, threadName: String) {
        handle = SessionHandle(pointer: session)
        self.maxWorkers = max(1, maxWorkers)
        self.threadName = threadName
    }

    /// Serves until a worker stops (the connection ended) or ``stop()`` is called; returns 0 or
    /// the negative errno of the read that ended it. The other workers may still be reading: ``join(abort:)``.
    func run() -> Int32 {
        if let stopped = state.withLock({ $0.result }) { return stopped }
        started.add(1, ordering: .relaxed)
        idle.add(1, ordering: .relaxed)
        guard startWorker() else { return -EAGAIN }
        return state.wait(until: { $0.result != nil }) { $0.result ?? 0 } ?? 0
    }

    /// Makes ``run()`` return (at once, or as soon as it is called) with 0, for the end of the
    /// session; the workers end with the connection.
    func stop() {
        state.withLock { if $0.result == nil { $0.result = 0 } }
    }

    /// Waits for every worker to end. Call it once the connection is gone or aborted: their
    /// reads return then. A worker still reading after a grace period means the connection
    /// outlived the unmount (it was detached lazily with files open, so the unmount could not
    /// abort it through the mount point): `abort` is asked to end it, and a worker that still
    /// reads after that is cancelled, the old way, rather than waited on forever.
    func join(abort: () -> Void) {
        let workers = state.withLock { $0.workers }
        /// Joins what it can of `workers` within one grace period for them all.
        func joinWithin(_ workers: [pthread_t]) -> [pthread_t] {
            let clock = ContinuousClock()
            let deadline = clock.now + .seconds(2)
            return workers.filter { worker in
                let left = max(0, (deadline - clock.now) / .milliseconds(1))
                return docfs_join_within(worker, Int(left)) != 0
            }
        }
        var running = joinWithin(workers)
        guard !running.isEmpty else { return }
        abort()
        running = joinWithin(running)
        for worker in running {
            pthread_cancel(worker)
            pthread_join(worker, nil)
        }
    }

    /// Counts one more worker in `started` if the limit allows.
    private func takeWorkerSlot() -> Bool {
        var current = started.load(ordering: .relaxed)
        while current < maxWorkers {
            let (exchanged, seen) = started.compareExchange(
                expected: current, desired: current + 1, ordering: .relaxed)
            if exchanged { return true }
            current = seen
        }
        return false
    }

    /// Starts a worker already counted in `started` and `idle`.
    @discardableResult
    private func startWorker() -> Bool {
        guard let thread = startThread(name: threadName, { [self] in work() }) else {
            started.subtract(1, ordering: .relaxed)
            idle.subtract(1, ordering: .relaxed)
            return false
        }
        state.withLock { $0.workers.append(thread) }
        return true
    }

    private func work() {
        var buffer = fuse_buf()
        defer { free(buffer.mem) }
        var old: Int32 = 0
        var ended: Int32 = 0
        while fuse_session_exited(session) == 0 {
            // Cancellable only while reading (for the last resort in `join`, seconds after
            // the connection should have ended, so never in the middle of libfuse's perror).
            pthread_setcancelstate(Int32(PTHREAD_CANCEL_ENABLE), &old)
            let received = fuse_session_receive_buf(session, &buffer)
            pthread_setcancelstate(Int32(PTHREAD_CANCEL_DISABLE), &old)
            if received == -EINTR { continue }
            if received <= 0 {
                // 0: the connection is gone (ENODEV) or the session was told to exit. Any other
                // error ends the session too, and is reported.
                ended = received
                fuse_session_exit(session)
                break
            }
            // The last idle worker taking a request starts another, up to the limit.
            if idle.subtract(1, ordering: .acquiringAndReleasing).newValue == 0, takeWorkerSlot() {
                idle.add(1, ordering: .relaxed)
                startWorker()
            }
            // A request read after the session was told to exit is still answered: its caller
            // would otherwise wait for the abort.
            fuse_session_process_buf(session, &buffer)
            idle.add(1, ordering: .relaxed)
        }
        idle.subtract(1, ordering: .relaxed)
        state.withLock { state in
            if state.result == nil { state.result = ended }
        }
    }
}
