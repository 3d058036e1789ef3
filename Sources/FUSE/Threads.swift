import CFuse3

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// State guarded by a pthread mutex with a condition variable, for threads that must sleep
/// until something changes. Swift's `Mutex` has no condition; Dispatch would add its own
/// worker threads, which the leak tests count.
final class Monitor<State>: @unchecked Sendable {
    private var state: State
    private let mutex = UnsafeMutablePointer<pthread_mutex_t>.allocate(capacity: 1)
    private let cond = UnsafeMutablePointer<pthread_cond_t>.allocate(capacity: 1)

    init(_ initial: State) {
        state = initial
        pthread_mutex_init(mutex, nil)
        var attr = pthread_condattr_t()
        pthread_condattr_init(&attr)
        // Monotonic, so a wall-clock jump cannot stretch or cut a timed wait.
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC)
        pthread_cond_init(cond, &attr)
        pthread_condattr_destroy(&attr)
    }

    deinit {
        pthread_cond_destroy(cond)
        pthread_mutex_destroy(mutex)
        cond.deallocate()
        mutex.deallocate()
    }

    /// Runs `body` under the lock and, unless `wake` is false, wakes every waiter afterwards.
    /// Pass false for changes no waiter waits for: a waiter woken for nothing costs a context
    /// switch (the request loop's counts change twice per request, and woke the thread waiting
    /// for the loop's end each time).
    func withLock<R>(wake: Bool = true, _ body: (inout State) throws -> R) rethrows -> R {
        pthread_mutex_lock(mutex)
        defer {
            if wake { pthread_cond_broadcast(cond) }
            pthread_mutex_unlock(mutex)
        }
        return try body(&state)
    }

    /// Waits until `ready` holds (then runs `body` under the same lock) or the timeout passes
    /// (then `body` is not run and the result is nil).
    func wait<R>(
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
        pthread_mutex_lock(mutex)
        defer { pthread_mutex_unlock(mutex) }
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

private final class ThreadStart {
    let name: String
    let body: () -> Void
    init(name: String, body: @escaping () -> Void) {
        self.name = name
        self.body = body
    }
}

/// Starts a joinable pthread named `name` (at most 15 bytes are kept). Threads it starts
/// inherit the name, which is how libfuse's workers come to be called like the loop thread.
func startThread(name: String, _ body: @escaping @Sendable () -> Void) -> pthread_t? {
    let start = Unmanaged.passRetained(ThreadStart(name: name, body: body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(
        &thread, nil,
        { raw in
            guard let raw else { return nil }
            let start = Unmanaged<ThreadStart>.fromOpaque(raw).takeRetainedValue()
            _ = pthread_setname_np(pthread_self(), String(start.name.utf8.prefix(15)) ?? "fuse")
            start.body()
            return nil
        }, start)
    if rc != 0 {
        Unmanaged<ThreadStart>.fromOpaque(start).release()
        return nil
    }
    return thread
}
