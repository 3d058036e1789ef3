import CLinuxSupport

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

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
@discardableResult
package func startThread(name: String, _ body: @escaping @Sendable () -> Void) -> pthread_t? {
    let start = Unmanaged.passRetained(ThreadStart(name: name, body: body)).toOpaque()
    var thread = pthread_t()
    let rc = pthread_create(
        &thread, nil,
        { raw in
            guard let raw else { return nil }
            let start = Unmanaged<ThreadStart>.fromOpaque(raw).takeRetainedValue()
            _ = docfs_set_thread_name(start.name)
            start.body()
            return nil
        }, start)
    if rc != 0 {
        Unmanaged<ThreadStart>.fromOpaque(start).release()
        return nil
    }
    return thread
}

/// Starts a detached pthread named `name`: for threads nobody joins, which free themselves when
/// they end. Returns false if no thread could be started.
@discardableResult
package func startDetachedThread(name: String, _ body: @escaping @Sendable () -> Void) -> Bool {
    guard let thread = startThread(name: name, body) else { return false }
    pthread_detach(thread)
    return true
}
