import CFuse3
import Synchronization
import SystemPackage

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The entries a directory reply collects before it is sent, and the lookups counted for them
/// (undone if the reply is not delivered). Held by the reply through an unretained reference it
/// releases itself, so that the reply stays trivially destroyed (``PendingRequest``).
final class DirectoryBuffer: Sendable {
    private struct State {
        var bytes: [UInt8] = []
        var undo: [@Sendable () -> Void] = []
    }
    private let state = Mutex(State())
    let capacity: Int

    init(capacity: Int) { self.capacity = capacity }

    static func make(capacity: Int) -> Unmanaged<DirectoryBuffer> {
        .passRetained(DirectoryBuffer(capacity: capacity))
    }

    /// Appends `needed` bytes that `fill` writes, if they fit; false if they do not.
    /// `prepare` runs first, only then (to count a lookup for the entry).
    func append<T>(
        _ needed: Int, prepare: (inout [@Sendable () -> Void]) -> T,
        _ fill: (UnsafeMutablePointer<CChar>, inout T) -> Void
    ) -> Bool {
        state.withLock { state in
            guard state.bytes.count + needed <= capacity else { return false }
            var prepared = prepare(&state.undo)
            let start = state.bytes.count
            state.bytes += repeatElement(0, count: needed)
            state.bytes.withUnsafeMutableBytes { raw in
                guard let base = raw.baseAddress else { return }
                fill(base.advanced(by: start).assumingMemoryBound(to: CChar.self), &prepared)
            }
            return true
        }
    }

    /// Sends the bytes; undoes the counted lookups if the kernel did not get them.
    func send(_ pending: PendingRequest) {
        let bytes = state.withLock { $0.bytes }
        let rc = bytes.withUnsafeBufferPointer { buf in
            pending.send { fuse_reply_buf($0, buf.baseAddress.map { UnsafeRawPointer($0) }, buf.count) }
        }
        if rc != 0 { undoLookups() }
    }

    func undoLookups() {
        let actions = state.withLock { state in
            defer { state.undo = [] }
            return state.undo
        }
        for action in actions { action() }
    }
}

/// Answers `readdir`: a buffer of entries filled with ``add(ino:offset:type:name:)`` until it
/// reports full, then sent with ``finish()``.
public struct ReplyDirectory: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    private let buffer: Unmanaged<DirectoryBuffer>
    /// The most bytes the kernel accepts in this reply.
    public var capacity: Int { buffer.takeUnretainedValue().capacity }

    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, capacity: Int) {
        pending = PendingRequest(request, core, operation)
        buffer = DirectoryBuffer.make(capacity: capacity)
    }
    deinit {
        buffer.release()
        pending.dropped()
    }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    public consuming func error(_ errno: Errno) {
        let (pending, buffer) = (pending, buffer)
        discard self
        buffer.release()
        pending.error(errno)
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
        let request = pending.request
        return name.withCString { cname in
            let needed = fuse_add_direntry(request, nil, 0, cname, nil, 0)
            return !buffer.takeUnretainedValue().append(needed, prepare: { _ in () }) { at, _ in
                _ = fuse_add_direntry(request, at, needed, cname, &st, off_t(Int64(bitPattern: offset)))
            }
        }
    }

    /// Sends the entries added so far; none means "end of directory".
    public consuming func finish() {
        let (pending, buffer) = (pending, buffer)
        discard self
        buffer.takeUnretainedValue().send(pending)
        buffer.release()
    }
}

/// Answers `readdirplus`: like ``ReplyDirectory`` but each entry carries a full ``Entry``, and
/// every entry except `.` and `..` counts one kernel lookup (balanced by `forget`).
public struct ReplyDirectoryPlus: Reply, ~Copyable, Sendable {
    let pending: PendingRequest
    private let buffer: Unmanaged<DirectoryBuffer>
    /// The most bytes the kernel accepts in this reply.
    public var capacity: Int { buffer.takeUnretainedValue().capacity }

    init(_ request: fuse_req_t, _ core: SessionCore, _ operation: StaticString, capacity: Int) {
        pending = PendingRequest(request, core, operation)
        buffer = DirectoryBuffer.make(capacity: capacity)
    }
    deinit {
        buffer.takeUnretainedValue().undoLookups()
        buffer.release()
        pending.dropped()
    }
    public var operation: StaticString { pending.operation }
    public var isInterrupted: Bool { pending.isInterrupted }

    /// Answers with an error; lookups counted for entries added so far are undone.
    public consuming func error(_ errno: Errno) {
        let (pending, buffer) = (pending, buffer)
        discard self
        pending.error(errno)
        buffer.takeUnretainedValue().undoLookups()
        buffer.release()
    }

    /// Appends an entry whose lookup the filesystem counts itself (for `.` and `..` the kernel
    /// takes no lookup). `offset` is the cookie of the next entry, as in ``ReplyDirectory``.
    ///
    /// - Returns: `true` if the buffer is full and the entry was **not** added.
    public func add(_ entry: Entry, offset: UInt64, name: FileName) -> Bool {
        append(offset, name) { _ in entry.param }
    }

    /// Appends the node of `key` in `table`, counting the lookup there unless `name` is `.` or
    /// `..`.
    ///
    /// - Returns: `true` if the buffer is full and the entry was **not** added (nothing counted).
    public func add<Key>(
        _ key: Key, in table: NodeTable<Key>, attributes: FileAttributes, offset: UInt64,
        name: FileName, attributeTimeout: Duration = .seconds(1), entryTimeout: Duration = .seconds(1)
    ) -> Bool {
        append(offset, name) { undo in
            if name.isDotOrDotDot {
                // The kernel takes no lookup for dot entries and ignores their attributes:
                // send node 0 so nothing is counted, and the node id only as d_ino.
                let ino = table.node(for: key)?.rawValue ?? 0
                var param = fuse_entry_param()
                param.attr = attributes.stat(defaultIno: ino)
                return param
            }
            let (node, generation) = table.acquire(key)
            undo.append { table.forget(node, lookups: 1) }
            return Entry(
                node: node, generation: generation, attributes: attributes,
                attributeTimeout: attributeTimeout, entryTimeout: entryTimeout
            ).param
        }
    }

    /// Adds the entry if it fits; `makeParam` runs only then (so nothing is counted for an
    /// entry that did not fit).
    private func append(
        _ offset: UInt64, _ name: FileName,
        makeParam: (inout [@Sendable () -> Void]) -> fuse_entry_param
    ) -> Bool {
        let request = pending.request
        return name.withCString { cname in
            let needed = fuse_add_direntry_plus(request, nil, 0, cname, nil, 0)
            return !buffer.takeUnretainedValue().append(needed, prepare: makeParam) { at, param in
                _ = fuse_add_direntry_plus(
                    request, at, needed, cname, &param, off_t(Int64(bitPattern: offset)))
            }
        }
    }

    /// Sends the entries added so far; none means "end of directory".
    public consuming func finish() {
        let (pending, buffer) = (pending, buffer)
        discard self
        buffer.takeUnretainedValue().send(pending)
        buffer.release()
    }
}
