import CFuse3
import Logging
import Synchronization
import SystemPackage

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The answer to one kernel request. Each request gets exactly one reply object, and each
/// reply object sends exactly one answer:
///
/// - the first reply method called wins; any later call is logged and ignored (it never
///   reaches libfuse, which would free the request twice);
/// - a reply object released without an answer answers `EIO` and logs a warning, so a
///   forgotten reply never hangs the caller;
/// - reply objects are `Sendable`: a handler may return at once and answer later from any
///   thread, which is how slow work leaves libfuse's worker thread.
///
/// A reply is a class rather than a `~Copyable` value because a noncopyable value cannot be
/// consumed inside an escaping closure, and handing the reply to another thread is the point.
public class Reply: @unchecked Sendable {
    let request: fuse_req_t
    let core: SessionCore
    /// The operation name, for logs.
    public let operation: StaticString
    private let answered = Atomic<Bool>(false)

    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString) {
        self.request = request
        self.core = core
        self.operation = operation
        core.replyCreated()
    }

    deinit {
        if answered.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
            .exchanged
        {
            core.logger.warning("\(operation) reply dropped without an answer: answering EIO")
            _ = core.sendReply(request) { fuse_reply_err($0, EIO) }
        }
    }

    /// True once this reply has been answered (by any thread).
    public var isAnswered: Bool { answered.load(ordering: .acquiring) }

    /// True if the kernel has interrupted the request (the caller got a signal). A slow handler
    /// may then stop early and answer `EINTR`. Only call this before answering.
    public var isInterrupted: Bool {
        !isAnswered && fuse_req_interrupted(request) != 0
    }

    /// Answers with an error (a non-positive code becomes `EIO`; success has its own method).
    public func error(_ errno: Errno) {
        let code = errno.rawValue > 0 ? errno.rawValue : EIO
        send { fuse_reply_err($0, code) }
    }

    /// Sends the answer if this is the first one; returns libfuse's result (0 = delivered).
    @discardableResult
    final func send(_ body: (fuse_req_t) -> CInt) -> CInt {
        guard
            answered.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
                .exchanged
        else {
            core.logger.error("\(operation): second reply ignored (a request is answered once)")
            return -EALREADY
        }
        let rc = core.sendReply(request, body)
        if rc != 0 && rc != -ENOTCONN {
            // ENOENT here means the request was interrupted and is gone: normal, not an error.
            core.logger.debug("\(operation) reply not delivered: \(Errno(rawValue: -rc))")
        }
        return rc
    }
}

/// Answers `setattr`-free operations that only succeed or fail: unlink, rmdir, rename, flush,
/// release, fsync, setxattr, removexattr, access, setlk, flock, fallocate, …
public final class ReplyEmpty: Reply, @unchecked Sendable {
    /// Answers success.
    public func ok() { send { fuse_reply_err($0, 0) } }
}

/// Answers an operation that names a node: lookup, mknod, mkdir, symlink, link.
///
/// Every successful entry reply counts one kernel lookup of the node, which a later `forget`
/// returns; ``entry(_:in:attributes:attributeTimeout:entryTimeout:)`` keeps that count in a
/// ``NodeTable`` for you.
public final class ReplyEntry: Reply, @unchecked Sendable {
    /// Answers with a node the filesystem tracks itself (it must count the lookup).
    public func entry(_ entry: Entry) {
        var param = entry.param
        send { fuse_reply_entry($0, &param) }
    }

    /// Answers with the node of `key` in `table`, counting the lookup there (undone if the
    /// kernel never receives the answer).
    public func entry<Key>(
        _ key: Key, in table: NodeTable<Key>, attributes: FileAttributes,
        attributeTimeout: Duration = .seconds(1), entryTimeout: Duration = .seconds(1)
    ) {
        let (node, generation) = table.acquire(key)
        var param = Entry(
            node: node, generation: generation, attributes: attributes,
            attributeTimeout: attributeTimeout, entryTimeout: entryTimeout
        ).param
        if send({ fuse_reply_entry($0, &param) }) != 0 {
            table.forget(node, lookups: 1)
        }
    }

    /// Answers "no such name" and lets the kernel cache that for `timeout` (a negative entry).
    /// With a zero timeout this is the same as `error(.noSuchFileOrDirectory)`.
    public func negative(timeout: Duration) {
        var param = fuse_entry_param()
        param.ino = 0
        param.entry_timeout = timeout.seconds
        send { fuse_reply_entry($0, &param) }
    }
}

/// Answers `create`: a new node and its open handle in one reply.
public final class ReplyCreate: Reply, @unchecked Sendable {
    /// Answers with a node the filesystem tracks itself.
    public func created(_ entry: Entry, handle: FileHandle, options: OpenOptions = []) {
        var param = entry.param
        var fi = fileInfo(handle, options)
        send { fuse_reply_create($0, &param, &fi) }
    }

    /// Answers with the node of `key` in `table`, counting the lookup there.
    public func created<Key>(
        _ key: Key, in table: NodeTable<Key>, attributes: FileAttributes, handle: FileHandle,
        options: OpenOptions = [], attributeTimeout: Duration = .seconds(1),
        entryTimeout: Duration = .seconds(1)
    ) {
        let (node, generation) = table.acquire(key)
        var param = Entry(
            node: node, generation: generation, attributes: attributes,
            attributeTimeout: attributeTimeout, entryTimeout: entryTimeout
        ).param
        var fi = fileInfo(handle, options)
        if send({ fuse_reply_create($0, &param, &fi) }) != 0 {
            table.forget(node, lookups: 1)
        }
    }
}

/// Answers `getattr` and `setattr`.
public final class ReplyAttr: Reply, @unchecked Sendable {
    let node: NodeID
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, node: NodeID) {
        self.node = node
        super.init(request, core, operation)
    }

    /// Answers with the attributes; the kernel caches them for `timeout` (0 = ask every time).
    public func attributes(_ attributes: FileAttributes, timeout: Duration = .seconds(1)) {
        var st = attributes.stat(defaultIno: node.rawValue)
        send { fuse_reply_attr($0, &st, timeout.seconds) }
    }
}

/// Answers `open` and `opendir`.
public final class ReplyOpen: Reply, @unchecked Sendable {
    /// Answers success with the handle later requests on this open will carry.
    public func opened(_ handle: FileHandle, options: OpenOptions = []) {
        var fi = fileInfo(handle, options)
        send { fuse_reply_open($0, &fi) }
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
public final class ReplyData: Reply, @unchecked Sendable {
    /// Answers with `bytes` (fewer than asked means end of file, unless `direct_io`).
    public func data(_ bytes: some Collection<UInt8>) {
        let sent = bytes.withContiguousStorageIfAvailable { buf in
            send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
        if sent == nil {
            let copy = Array(bytes)
            _ = copy.withUnsafeBufferPointer { buf in
                send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
            }
        }
    }

    /// Answers with the bytes of `buffer`, copied before this returns.
    public func data(_ buffer: UnsafeRawBufferPointer) {
        send { fuse_reply_buf($0, buffer.baseAddress, buffer.count) }
    }
}

/// Answers `write` and `copy_file_range`.
public final class ReplyWrite: Reply, @unchecked Sendable {
    /// Answers with the number of bytes written.
    public func written(_ count: Int) {
        send { fuse_reply_write($0, max(0, count)) }
    }
}

/// Answers `readlink`.
public final class ReplyReadlink: Reply, @unchecked Sendable {
    /// Answers with the link target's bytes.
    public func target(_ bytes: [UInt8]) {
        _ = (bytes + [0]).withUnsafeBufferPointer { buf in
            buf.withMemoryRebound(to: CChar.self) { chars in
                send { fuse_reply_readlink($0, chars.baseAddress) }
            }
        }
    }

    /// Answers with a UTF-8 link target.
    public func target(_ string: String) { target(Array(string.utf8)) }
}

/// Answers `statfs`.
public final class ReplyStatfs: Reply, @unchecked Sendable {
    public func statistics(_ statistics: FileSystemStatistics) {
        var s = statistics.statvfs
        send { fuse_reply_statfs($0, &s) }
    }
}

/// Answers `getxattr` and `listxattr`, which come in two shapes: a size probe (``size`` is 0:
/// answer with the length the value needs) and a fetch (answer with the bytes, or `ERANGE` if
/// they do not fit in ``size``). ``value(_:)`` and ``names(_:)`` pick the right shape.
public final class ReplyXattr: Reply, @unchecked Sendable {
    /// The buffer size the caller offered; 0 means "only tell me the size".
    public let size: Int
    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, size: Int) {
        self.size = size
        super.init(request, core, operation)
    }

    /// Answers a size probe with the length the value needs.
    public func needs(_ length: Int) { send { fuse_reply_xattr($0, max(0, length)) } }

    /// Answers a fetch with the raw bytes.
    public func data(_ bytes: [UInt8]) {
        _ = bytes.withUnsafeBufferPointer { buf in
            send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
    }

    /// Answers with a value: its size for a probe, the bytes if they fit, `ERANGE` otherwise.
    public func value(_ bytes: [UInt8]) {
        if size == 0 {
            needs(bytes.count)
        } else if bytes.count > size {
            error(.outOfRange)
        } else {
            data(bytes)
        }
    }

    /// Answers `listxattr` with the names (each sent NUL-terminated), like ``value(_:)``.
    public func names(_ names: [String]) {
        var list: [UInt8] = []
        for name in names {
            list += name.utf8
            list.append(0)
        }
        value(list)
    }
}

/// Answers `getlk`.
public final class ReplyLock: Reply, @unchecked Sendable {
    /// Answers with the conflicting lock, or a lock of kind `.unlock` if there is none.
    public func lock(_ lock: FileLock) {
        var fl = lock.flock
        send { fuse_reply_lock($0, &fl) }
    }
}

/// Answers `lseek`.
public final class ReplyLseek: Reply, @unchecked Sendable {
    public func offset(_ offset: Int64) { send { fuse_reply_lseek($0, off_t(offset)) } }
}

/// Answers `readdir`: a buffer of entries filled with ``add(ino:offset:type:name:)`` until it
/// reports full, then sent with ``finish()``.
public final class ReplyDirectory: Reply, @unchecked Sendable {
    private let lock = Mutex<[UInt8]>([])
    /// The most bytes the kernel accepts in this reply.
    public let capacity: Int

    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, capacity: Int) {
        self.capacity = capacity
        super.init(request, core, operation)
    }

    /// Appends an entry. `offset` is the cookie of the *next* entry: the kernel passes it back
    /// to continue after this one, so it must be stable while the directory changes (not an
    /// index into a list that can shift). `ino` is only reported as `d_ino`.
    ///
    /// - Returns: `true` if the buffer is full and the entry was **not** added: finish and let
    ///   the kernel ask again from the last offset.
    public func add(ino: UInt64, offset: UInt64, type: FileType, name: FileName) -> Bool {
        var st = stat()
        st.st_ino = UInt(ino)
        st.st_mode = type.modeBits
        return lock.withLock { buffer in
            name.withCString { cname in
                let needed = fuse_add_direntry(request, nil, 0, cname, nil, 0)
                guard buffer.count + needed <= capacity else { return true }
                let start = buffer.count
                buffer += repeatElement(0, count: needed)
                _ = buffer.withUnsafeMutableBytes { raw -> Int in
                    guard let base = raw.baseAddress else { return 0 }
                    return fuse_add_direntry(
                        request, base.advanced(by: start).assumingMemoryBound(to: CChar.self),
                        needed, cname, &st, off_t(Int64(bitPattern: offset)))
                }
                return false
            }
        }
    }

    /// Sends the entries added so far; none means "end of directory".
    public func finish() {
        let buffer = lock.withLock { $0 }
        _ = buffer.withUnsafeBufferPointer { buf in
            send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
    }
}

/// Answers `readdirplus`: like ``ReplyDirectory`` but each entry carries a full ``Entry``, and
/// every entry except `.` and `..` counts one kernel lookup (balanced by `forget`).
public final class ReplyDirectoryPlus: Reply, @unchecked Sendable {
    private struct State {
        var buffer: [UInt8] = []
        /// Lookups counted in tables for added entries, undone if the reply is not delivered.
        var undo: [@Sendable () -> Void] = []
    }
    private let lock = Mutex<State>(State())
    /// The most bytes the kernel accepts in this reply.
    public let capacity: Int

    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, capacity: Int) {
        self.capacity = capacity
        super.init(request, core, operation)
    }

    deinit {
        if !isAnswered {
            for undo in lock.withLock({ $0.undo }) { undo() }
        }
    }

    /// Appends an entry whose lookup the filesystem counts itself (for `.` and `..` the kernel
    /// takes no lookup). `offset` is the cookie of the next entry, as in ``ReplyDirectory``.
    ///
    /// - Returns: `true` if the buffer is full and the entry was **not** added.
    public func add(_ entry: Entry, offset: UInt64, name: FileName) -> Bool {
        lock.withLock { state in
            append(&state, offset, name) { _ in entry.param }
        }
    }

    /// Appends the node of `key` in `table`, counting the lookup there unless `name` is `.` or
    /// `..`.
    ///
    /// - Returns: `true` if the buffer is full and the entry was **not** added (nothing counted).
    public func add<Key>(
        _ key: Key, in table: NodeTable<Key>, attributes: FileAttributes, offset: UInt64,
        name: FileName, attributeTimeout: Duration = .seconds(1), entryTimeout: Duration = .seconds(1)
    ) -> Bool {
        lock.withLock { state in
            append(&state, offset, name) { state in
                if name.isDotOrDotDot {
                    // The kernel takes no lookup for dot entries and ignores their attributes:
                    // send node 0 so nothing is counted, and the node id only as d_ino.
                    let ino = table.node(for: key)?.rawValue ?? 0
                    var param = fuse_entry_param()
                    param.attr = attributes.stat(defaultIno: ino)
                    return param
                }
                let (node, generation) = table.acquire(key)
                state.undo.append { table.forget(node, lookups: 1) }
                return Entry(
                    node: node, generation: generation, attributes: attributes,
                    attributeTimeout: attributeTimeout, entryTimeout: entryTimeout
                ).param
            }
        }
    }

    /// Adds the entry if it fits; `makeParam` runs only then (so nothing is counted for an
    /// entry that did not fit).
    private func append(
        _ state: inout State, _ offset: UInt64, _ name: FileName,
        makeParam: (inout State) -> fuse_entry_param
    ) -> Bool {
        name.withCString { cname in
            let needed = fuse_add_direntry_plus(request, nil, 0, cname, nil, 0)
            guard state.buffer.count + needed <= capacity else { return true }
            var param = makeParam(&state)
            let start = state.buffer.count
            state.buffer += repeatElement(0, count: needed)
            _ = state.buffer.withUnsafeMutableBytes { raw -> Int in
                guard let base = raw.baseAddress else { return 0 }
                return fuse_add_direntry_plus(
                    request, base.advanced(by: start).assumingMemoryBound(to: CChar.self),
                    needed, cname, &param, off_t(Int64(bitPattern: offset)))
            }
            return false
        }
    }

    /// Sends the entries added so far; none means "end of directory".
    public func finish() {
        let state = lock.withLock { state in
            defer { state.undo = [] }
            return state
        }
        let rc = state.buffer.withUnsafeBufferPointer { buf in
            send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
        if rc != 0 && rc != -EALREADY {
            for undo in state.undo { undo() }
        }
    }

    /// Answers with an error; lookups counted for entries added so far are undone.
    public override func error(_ errno: Errno) {
        let undo = lock.withLock { state in
            defer { state.undo = [] }
            return state.undo
        }
        super.error(errno)
        for action in undo { action() }
    }
}
