import CFuse3
import Logging
import Synchronization
import SystemPackage
import Threading

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// Pushes cache invalidations and data to the kernel; usable from any thread, including from
/// inside a request handler.
///
/// Every call only queues the notification: one dedicated thread per session sends them.
/// That is what makes it safe from a handler. libfuse warns (docs/design/fuse-notes.md §3.6) that
/// `inval_entry`, `inval_inode`, `delete` and `store` can block until the kernel gets a lock
/// that a pending request holds (e.g. the parent directory's lock during a lookup), so sending
/// one synchronously from the handler of that request deadlocks. Queued, the handler returns,
/// the request completes, the lock is released and the notification goes through.
///
/// Completions run on the notifier thread; keep them short. After the session ends every call
/// completes with `ENOTCONN` (``Errno/socketNotConnected``).
public final class Notifier: Sendable {
    let core: SessionCore

    init(core: SessionCore) { self.core = core }

    /// Result of a notification: `ENOENT` means the kernel does not cache that node or name
    /// (nothing to invalidate), which callers usually ignore.
    public typealias Completion = @Sendable (Result<Void, Errno>) -> Void

    /// Drops cached data of `node` in `[offset, offset+length)` (length 0: to the end) and its
    /// attributes; a negative `offset` drops only the attributes.
    public func invalidateInode(
        _ node: NodeID, offset: Int64 = 0, length: Int64 = 0, completion: Completion? = nil
    ) {
        core.notifications.enqueue(.invalidateInode(node, offset, length), completion)
    }

    /// Drops the cached name `name` in `parent` (the next access looks it up again).
    public func invalidateEntry(parent: NodeID, name: FileName, completion: Completion? = nil) {
        core.notifications.enqueue(.invalidateEntry(parent, name), completion)
    }

    /// Tells the kernel that `name` in `parent`, naming `child`, is gone (removed by someone
    /// else); like ``invalidateEntry(parent:name:completion:)`` plus dropping the dentry of
    /// `child` even while it is in use.
    public func delete(
        parent: NodeID, child: NodeID, name: FileName, completion: Completion? = nil
    ) {
        core.notifications.enqueue(.delete(parent, child, name), completion)
    }

    /// Puts `data` into the kernel's page cache of `node` at `offset` (extending the cached
    /// size if needed).
    public func store(
        _ node: NodeID, offset: UInt64, data: [UInt8], completion: Completion? = nil
    ) {
        core.notifications.enqueue(.store(node, offset, data), completion)
    }

    /// Asks the kernel for the cached data of `node` at `offset` (at most `size` bytes; it
    /// stops at the first page it does not have). The data arrives through a request the
    /// session routes back here.
    public func retrieve(
        _ node: NodeID, offset: UInt64, size: Int,
        completion: @escaping @Sendable (Result<[UInt8], Errno>) -> Void
    ) {
        core.notifications.enqueue(
            .retrieve(node, offset, size, completion),
            { result in
                // Only a failure to send completes here; data comes back via retrieve_reply.
                if case .failure(let errno) = result { completion(.failure(errno)) }
            })
    }

    /// ``retrieve(_:offset:size:completion:)`` as an `async` call.
    public func retrieve(_ node: NodeID, offset: UInt64, size: Int) async throws(Errno) -> [UInt8] {
        let result = await withCheckedContinuation { continuation in
            retrieve(node, offset: offset, size: size) { continuation.resume(returning: $0) }
        }
        return try result.get()
    }
}

/// The queue and thread behind ``Notifier``.
final class NotificationQueue: Sendable {
    enum Kind: Sendable {
        case invalidateInode(NodeID, Int64, Int64)
        case invalidateEntry(NodeID, FileName)
        case delete(NodeID, NodeID, FileName)
        case store(NodeID, UInt64, [UInt8])
        case retrieve(NodeID, UInt64, Int, @Sendable (Result<[UInt8], Errno>) -> Void)
        /// Runs a retrieve completion on this thread.
        case deliver(@Sendable () -> Void)
    }
    private struct Job: Sendable {
        var kind: Kind
        var completion: Notifier.Completion?
    }
    private struct State {
        var jobs: [Job] = []
        var stopping = false
        var stopped = false
        var session: SessionHandle?
        var thread: pthread_t?
    }

    private let state = Monitor(State())
    private let pending = Mutex<
        (next: UInt64, waiting: [UInt64: @Sendable (Result<[UInt8], Errno>) -> Void])
    >(
        (1, [:]))
    private let logger: Logger

    init(logger: Logger) { self.logger = logger }

    func start(session: OpaquePointer, threadName: String) -> Bool {
        let thread = startThread(name: threadName) { [self] in run() }
        state.withLock {
            $0.session = SessionHandle(pointer: session)
            $0.thread = thread
        }
        return thread != nil
    }

    func enqueue(_ kind: Kind, _ completion: Notifier.Completion?) {
        let accepted = state.withLock { state in
            guard !state.stopping, !state.stopped, state.thread != nil else { return false }
            state.jobs.append(Job(kind: kind, completion: completion))
            return true
        }
        if !accepted { completion?(.failure(.socketNotConnected)) }
    }

    /// Sends what is queued, fails retrieves still waiting, and joins the thread.
    func stop() {
        let thread = state.withLock { state -> pthread_t? in
            state.stopping = true
            return state.thread
        }
        if let thread { pthread_join(thread, nil) }
        let waiting = pending.withLock { pending in
            defer { pending.waiting = [:] }
            return pending.waiting
        }
        for completion in waiting.values { completion(.failure(.socketNotConnected)) }
        state.withLock {
            $0.thread = nil
            $0.stopped = true
        }
    }

    /// Called from libfuse's retrieve_reply callback.
    func retrieved(id: UInt64, data: [UInt8]) {
        let completion = pending.withLock { $0.waiting.removeValue(forKey: id) }
        guard let completion else { return }
        let queued = state.withLock { state in
            guard !state.stopped, state.thread != nil else { return false }
            state.jobs.append(Job(kind: .deliver({ completion(.success(data)) }), completion: nil))
            return true
        }
        if !queued { completion(.success(data)) }
    }

    private func run() {
        while true {
            let (jobs, session, finished): ([Job], OpaquePointer?, Bool) =
                state.wait(until: { !$0.jobs.isEmpty || $0.stopping }) { state in
                    defer { state.jobs = [] }
                    // Decided under the lock, so nothing can be queued after the last look.
                    if state.stopping && state.jobs.isEmpty { state.stopped = true }
                    return (state.jobs, state.session?.pointer, state.stopped)
                } ?? ([], nil, true)
            for job in jobs {
                guard let session else {
                    job.completion?(.failure(.socketNotConnected))
                    continue
                }
                let rc = send(job.kind, session)
                job.completion?(rc == 0 ? .success(()) : .failure(Errno(rawValue: -rc)))
            }
            if finished { return }
        }
    }

    private func send(_ kind: Kind, _ se: OpaquePointer) -> CInt {
        switch kind {
        case .invalidateInode(let node, let offset, let length):
            return fuse_lowlevel_notify_inval_inode(se, node.rawValue, off_t(offset), off_t(length))
        case .invalidateEntry(let parent, let name):
            return name.withCString {
                fuse_lowlevel_notify_inval_entry(se, parent.rawValue, $0, name.bytes.count)
            }
        case .delete(let parent, let child, let name):
            return name.withCString {
                fuse_lowlevel_notify_delete(se, parent.rawValue, child.rawValue, $0, name.bytes.count)
            }
        case .store(let node, let offset, let data):
            return data.withUnsafeBytes {
                docfs_notify_store(se, node.rawValue, off_t(clamping: offset), $0.baseAddress, $0.count)
            }
        case .retrieve(let node, let offset, let size, let completion):
            let id = pending.withLock { pending in
                defer { pending.next += 1 }
                pending.waiting[pending.next] = completion
                return pending.next
            }
            let cookie = UnsafeMutableRawPointer(bitPattern: UInt(id))
            let rc = fuse_lowlevel_notify_retrieve(
                se, node.rawValue, size_t(max(0, size)), off_t(clamping: offset), cookie)
            if rc != 0 { _ = pending.withLock { $0.waiting.removeValue(forKey: id) } }
            return rc
        case .deliver(let body):
            body()
            return 0
        }
    }
}
