import CFuse3
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The answer to one kernel request. Every reply type is noncopyable, and each of its
/// answering methods consumes it, so the compiler sees to it that a request is answered at
/// most once: a second answer, or an answer after the reply was handed on, does not compile.
/// A reply that goes away unanswered (a handler that forgot it, or threw it away) answers
/// `EIO` and logs a warning, so the caller never hangs.
///
/// A reply may be answered after its handler returned, from another thread: move it into a
/// `Mutex` (which holds noncopyable values) and take it out there. Most file systems answer
/// before returning.
public protocol Reply: ~Copyable {
    /// The operation name, for logs.
    var operation: StaticString { get }
    /// True if the kernel has interrupted the request (the caller got a signal): a slow
    /// handler may stop early and answer `EINTR`.
    var isInterrupted: Bool { get }
    /// Answers with an error (a non-positive code becomes `EIO`).
    consuming func error(_ errno: Errno)
}

/// What every reply holds: libfuse's request and the session serving it. Trivially destroyed
/// (an unretained core, which outlives every request), so that a reply can `discard` itself
/// once it has answered.
// @unchecked: libfuse's request pointer, which libfuse lets any one thread answer.
struct PendingRequest: @unchecked Sendable {
    let request: fuse_req_t
    let core: Unmanaged<SessionCore>
    let operation: StaticString

    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        self.request = request
        self.core = .passUnretained(core)
        self.operation = operation
        core.replyCreated()
    }

    var isInterrupted: Bool { fuse_req_interrupted(request) != 0 }

    /// Sends the answer; returns libfuse's result (0 = delivered).
    @discardableResult
    func send(_ body: (fuse_req_t) -> CInt) -> CInt {
        let core = core.takeUnretainedValue()
        let rc = core.sendReply(request, body)
        if rc != 0 && rc != -ENOTCONN {
            // ENOENT here means the request was interrupted and is gone: normal, not an error.
            core.logger.debug("\(operation) reply not delivered: \(Errno(rawValue: -rc))")
        }
        return rc
    }

    func error(_ errno: Errno) {
        let code = errno.rawValue > 0 ? errno.rawValue : EIO
        send { fuse_reply_err($0, code) }
    }

    /// A reply dropped without an answer.
    func dropped() {
        core.takeUnretainedValue().logger.warning(
            "\(operation) reply dropped without an answer: answering EIO")
        send { fuse_reply_err($0, EIO) }
    }
}

/// Answers operations that only succeed or fail: unlink, rmdir, rename, flush, release, fsync,
/// setxattr, removexattr, access, setlk, flock, fallocate, …
public struct ReplyEmpty: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers success.
    public consuming func ok() {
        let pending = pending
        discard self
        pending.send { fuse_reply_err($0, 0) }
    }
}

/// Answers an operation that names a node: lookup, mknod, mkdir, symlink, link.
///
/// Every successful entry reply counts one kernel lookup of the node, which a later `forget`
/// returns; ``entry(_:in:attributes:attributeTimeout:entryTimeout:)`` keeps that count in a
/// ``NodeTable`` for you.
public struct ReplyEntry: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with a node the filesystem tracks itself (it must count the lookup).
    public consuming func entry(_ entry: Entry) {
        let pending = pending
        discard self
        var param = entry.param
        pending.send { fuse_reply_entry($0, &param) }
    }

    /// Answers with the node of `key` in `table`, counting the lookup there (undone if the
    /// kernel never receives the answer).
    public consuming func entry<Key>(
        _ key: Key, in table: NodeTable<Key>, attributes: FileAttributes,
        attributeTimeout: Duration = .seconds(1), entryTimeout: Duration = .seconds(1)
    ) {
        let pending = pending
        discard self
        let (node, generation) = table.acquire(key)
        var param = Entry(
            node: node, generation: generation, attributes: attributes,
            attributeTimeout: attributeTimeout, entryTimeout: entryTimeout
        ).param
        if pending.send({ fuse_reply_entry($0, &param) }) != 0 {
            table.forget(node, lookups: 1)
        }
    }

    /// Answers "no such name" and lets the kernel cache that for `timeout` (a negative entry).
    /// With a zero timeout this is the same as `error(.noSuchFileOrDirectory)`.
    public consuming func negative(timeout: Duration) {
        let pending = pending
        discard self
        var param = fuse_entry_param()
        param.ino = 0
        param.entry_timeout = timeout.seconds
        pending.send { fuse_reply_entry($0, &param) }
    }
}

/// Answers `create`: a new node and its open handle in one reply.
public struct ReplyCreate: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with a node the filesystem tracks itself.
    public consuming func created(_ entry: Entry, handle: FileHandle, options: OpenOptions = []) {
        let pending = pending
        discard self
        var param = entry.param
        var fi = fileInfo(handle, options)
        pending.send { fuse_reply_create($0, &param, &fi) }
    }

    /// Answers with the node of `key` in `table`, counting the lookup there.
    public consuming func created<Key>(
        _ key: Key, in table: NodeTable<Key>, attributes: FileAttributes, handle: FileHandle,
        options: OpenOptions = [], attributeTimeout: Duration = .seconds(1),
        entryTimeout: Duration = .seconds(1)
    ) {
        let pending = pending
        discard self
        let (node, generation) = table.acquire(key)
        var param = Entry(
            node: node, generation: generation, attributes: attributes,
            attributeTimeout: attributeTimeout, entryTimeout: entryTimeout
        ).param
        var fi = fileInfo(handle, options)
        if pending.send({ fuse_reply_create($0, &param, &fi) }) != 0 {
            table.forget(node, lookups: 1)
        }
    }
}

/// Answers `getattr` and `setattr`.
public struct ReplyAttr: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    let node: NodeID
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, node: NodeID) {
        pending = PendingRequest(request, core, operation)
        self.node = node
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with the attributes; the kernel caches them for `timeout` (0 = ask every time).
    public consuming func attributes(_ attributes: FileAttributes, timeout: Duration = .seconds(1)) {
        let pending = pending
        let node = node
        discard self
        var st = attributes.stat(defaultIno: node.rawValue)
        pending.send { fuse_reply_attr($0, &st, timeout.seconds) }
    }
}

/// Answers `open` and `opendir`.
public struct ReplyOpen: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers success with the handle later requests on this open will carry.
    public consuming func opened(_ handle: FileHandle, options: OpenOptions = []) {
        let pending = pending
        discard self
        var fi = fileInfo(handle, options)
        pending.send { fuse_reply_open($0, &fi) }
    }
}

func fileInfo(_ handle: FileHandle, _ options: OpenOptions) -> fuse_file_info {
    var fi = fuse_file_info()
    fi.fh = handle.rawValue
    fi.direct_io = options.contains(.directIO) ? 1 : 0
    fi.keep_cache = options.contains(.keepCache) ? 1 : 0
    fi.nonseekable = options.contains(.nonSeekable) ? 1 : 0
    fi.cache_readdir = options.contains(.cacheDirectory) ? 1 : 0
    fi.noflush = options.contains(.noFlush) ? 1 : 0
    return fi
}

/// Answers `read`.
public struct ReplyData: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with `bytes` (fewer than asked means end of file, unless `direct_io`).
    public consuming func data(_ bytes: some Collection<UInt8>) {
        let pending = pending
        discard self
        let sent = bytes.withContiguousStorageIfAvailable { buf in
            pending.send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
        if sent == nil {
            let copy = Array(bytes)
            _ = copy.withUnsafeBufferPointer { buf in
                pending.send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
            }
        }
    }

    /// Answers with the bytes of `buffer`, copied before this returns.
    public consuming func data(_ buffer: UnsafeRawBufferPointer) {
        let pending = pending
        discard self
        pending.send { fuse_reply_buf($0, buffer.baseAddress, buffer.count) }
    }
}

/// Answers `write` and `copy_file_range`.
public struct ReplyWrite: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with the number of bytes written.
    public consuming func written(_ count: Int) {
        let pending = pending
        discard self
        pending.send { fuse_reply_write($0, max(0, count)) }
    }
}

/// Answers `readlink`.
public struct ReplyReadlink: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with the link target's bytes.
    public consuming func target(_ bytes: [UInt8]) {
        let pending = pending
        discard self
        _ = (bytes + [0]).withUnsafeBufferPointer { buf in
            buf.withMemoryRebound(to: CChar.self) { chars in
                pending.send { fuse_reply_readlink($0, chars.baseAddress) }
            }
        }
    }

    /// Answers with a UTF-8 link target.
    public consuming func target(_ string: String) { target(Array(string.utf8)) }
}

/// Answers `statfs`.
public struct ReplyStatfs: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    public consuming func statistics(_ statistics: FileSystemStatistics) {
        let pending = pending
        discard self
        var s = statistics.statvfs
        pending.send { fuse_reply_statfs($0, &s) }
    }
}

/// Answers `getxattr` and `listxattr`, which come in two shapes: a size probe (``size`` is 0:
/// answer with the length the value needs) and a fetch (answer with the bytes, or `ERANGE` if
/// they do not fit in ``size``). ``value(_:)`` and ``names(_:)`` pick the right shape.
public struct ReplyXattr: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    /// The buffer size the caller offered; 0 means "only tell me the size".
    public let size: Int
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, size: Int) {
        pending = PendingRequest(request, core, operation)
        self.size = size
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers a size probe with the length the value needs.
    public consuming func needs(_ length: Int) {
        let pending = pending
        discard self
        pending.send { fuse_reply_xattr($0, max(0, length)) }
    }

    /// Answers a fetch with the raw bytes.
    public consuming func data(_ bytes: [UInt8]) {
        let pending = pending
        discard self
        _ = bytes.withUnsafeBufferPointer { buf in
            pending.send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
    }

    /// Answers with a value: its size for a probe, the bytes if they fit, `ERANGE` otherwise.
    public consuming func value(_ bytes: [UInt8]) {
        if size == 0 {
            needs(bytes.count)
        } else if bytes.count > size {
            error(.outOfRange)
        } else {
            data(bytes)
        }
    }

    /// Answers `listxattr` with the names (each sent NUL-terminated), like ``value(_:)``.
    public consuming func names(_ names: [String]) {
        var list: [UInt8] = []
        for name in names {
            list += name.utf8
            list.append(0)
        }
        value(list)
    }
}

/// Answers `getlk`.
public struct ReplyLock: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    /// Answers with the conflicting lock, or a lock of kind `.unlock` if there is none.
    public consuming func lock(_ lock: FileLock) {
        let pending = pending
        discard self
        var fl = lock.flock
        pending.send { fuse_reply_lock($0, &fl) }
    }
}

/// Answers `lseek`.
public struct ReplyLseek: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        pending = PendingRequest(request, core, operation)
    }
    deinit { pending.dropped() }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let pending = pending
        discard self
        pending.error(errno)
    }

    public consuming func offset(_ offset: Int64) {
        let pending = pending
        discard self
        pending.send { fuse_reply_lseek($0, off_t(offset)) }
    }
}

/// A reply moved out of its handler, to be answered later from any thread: the handler returns
/// at once and the request waits. ``take()`` gives the reply back exactly once.
public final class DeferredReply<R: Reply & ~Copyable & Sendable>: Sendable {
    private let slot: Mutex<R?>

    public init(_ reply: consuming R) { slot = Mutex(Optional(reply)) }

    /// The reply, the first time; nil afterwards.
    public func take() -> R? { slot.withLock { $0.take() } }
}
