#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// State guarded by a ranked mutex with a condition variable, for threads that must sleep until
/// something changes: the project's one way to wait (no semaphores, groups or `NSCondition`).
/// Swift's `Mutex` has no condition; Dispatch would add its own worker threads, which the leak
/// tests count.
package final class Monitor<State> {
    private var state: State
    private let lock: OrderedLock
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)
    private var mutex: UnsafeMutablePointer<pthread_mutex_t> { lock.mutex }

    /// - Parameter rank: where the monitor's lock stands in the lock order; most are leaves.
    package init(_ initial: State, rank: LockRank = .leaf) {
        state = initial
        lock = OrderedLock(rank)
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        // Monotonic, so a wall-clock jump cannot stretch or cut a timed wait.
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    deinit {
        pthread_cond_destroy(cond)
        cond.deallocate()
    }

    /// Runs `body` under the lock and, unless `wake` is false, wakes every waiter afterwards.
    /// Pass false for changes no waiter waits for: a waiter woken for nothing costs a context
    /// switch (the request loop's counts change twice per request, and woke the thread waiting
    /// for the loop's end each time).
    package func withLock<R>(wake: Bool = true, _ body: (inout State) throws -> R) rethrows -> R {
        lock.lock()
        defer {
            if wake { pthread_cond_broadcast(cond) }
            lock.unlock()
        }
        return try body(&state)
    }

    /// Waits until `ready` holds (then runs `body` under the same lock) or the timeout passes
    /// (then `body` is not run and the result is nil).
    package func wait<R>(
        until ready: (State) -> Bool, timeout: Duration? = nil, then body: (inout State) -> R
    ) -> R? {
        var deadline = timespec()
        if let timeout {
            clock_gettime(CLOCK_MONOTONIC, &deadline)
            let (s, atto) = timeout.components
            let nanos = Int(deadline.tv_nsec) + Int(atto / 1_000_000_000)
            deadline.tv_sec += Int(s) + nanos / 1_000_000_000
            deadline.tv_nsec = nanos % 1_000_000_000
        }
        lock.lock()
        defer { lock.unlock() }
        while !ready(state) {
            if timeout != nil {
                if pthread_cond_timedwait(cond, mutex, &deadline) == ETIMEDOUT, !ready(state) {
                    return nil
                }
            } else {
                pthread_cond_wait(cond, mutex)
            }
        }
        let result = body(&state)
        pthread_cond_broadcast(cond)
        return result
    }
}

/// Waits until `ready` holds, with no timeout.
extension Monitor {
    package func wait(until ready: (State) -> Bool) {
        _ = wait(until: ready, timeout: nil) { _ in () }
    }
}

// @unchecked: pthread_cond_t is a C type; the lock guards `state`, which may cross threads only
// when it is Sendable itself.
extension Monitor: @unchecked Sendable where State: Sendable {}
