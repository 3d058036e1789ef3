import CFuse3
import SystemPackage

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

// MARK: - Identifiers

/// A kernel node id (`fuse_ino_t`): the number the kernel uses to name an inode of this mount.
///
/// Distinct from `st_ino` (``FileAttributes/ino``) and from a filesystem's own ids; use
/// ``NodeTable`` to map between them.
public struct NodeID: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    /// The mount's root directory (`FUSE_ROOT_ID`); the kernel never forgets it.
    public static let root = NodeID(UInt64(FUSE_ROOT_ID))
    public var description: String { "node#\(rawValue)" }
}

/// A per-open handle chosen by the filesystem in `open`, `opendir` or `create`.
public struct FileHandle: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    /// The handle of an open answered without one (the default `open`/`opendir`).
    public static let none = FileHandle(0)
    public var description: String { "fh#\(rawValue)" }
}

/// The generation of a node id: (node id, generation) must be unique for the mount's lifetime,
/// so a reused node id needs a higher generation (NFS export relies on it).
public struct Generation: RawRepresentable, Hashable, Comparable, Sendable {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public static func < (a: Self, b: Self) -> Bool { a.rawValue < b.rawValue }
}

/// The opaque owner of POSIX or BSD locks (`fuse_file_info.lock_owner`).
public struct LockOwner: RawRepresentable, Hashable, Sendable {
    public var rawValue: UInt64
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }
}

/// One directory entry name, as raw bytes: Linux names need not be UTF-8, and a name must
/// round-trip exactly.
public struct FileName: Hashable, Sendable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// The name's bytes, without a terminating NUL.
    public let bytes: [UInt8]
    public init(_ string: String) { bytes = Array(string.utf8) }
    public init(bytes: [UInt8]) { self.bytes = bytes }
    public init(stringLiteral value: String) { self.init(value) }
    init(cString: UnsafePointer<CChar>) {
        bytes = Array(UnsafeRawBufferPointer(start: cString, count: strlen(cString)))
    }
    /// The name decoded as UTF-8 (invalid sequences replaced); for display and simple matching.
    public var string: String { String(decoding: bytes, as: UTF8.self) }
    public var description: String { string }
    /// True for `.` and `..`, which never count as kernel lookups.
    public var isDotOrDotDot: Bool { bytes == [0x2E] || bytes == [0x2E, 0x2E] }
    func withCString<R>(_ body: (UnsafePointer<CChar>) -> R) -> R {
        (bytes + [0]).withUnsafeBufferPointer { buf in
            buf.withMemoryRebound(to: CChar.self) { body($0.baseAddress!) }
        }
    }
}

/// Who sent a request (`fuse_req_ctx`). With `writepage` writes these fields are not valid.
public struct RequestContext: Hashable, Sendable {
    public var uid: UInt32
    public var gid: UInt32
    /// Thread id of the calling process.
    public var pid: Int32
    /// The caller's umask; apply it in `create`, `mkdir`, `mknod` unless the kernel did.
    public var umask: FilePermissions
    /// The kernel asks the filesystem to clear the file's set-user-ID bit, and its set-group-ID
    /// bit if it is group-executable, as the request changes it: a `write`, a truncating
    /// `setattr` or an `open(O_TRUNC)` by a caller without `CAP_FSETID`, or a `chown`. Only
    /// with ``KernelConfig/Capabilities-swift.struct/handleKillPrivV2``.
    public var killsSetIDBits: Bool
    public init(uid: UInt32, gid: UInt32, pid: Int32, umask: FilePermissions, killsSetIDBits: Bool = false) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
        self.umask = umask
        self.killsSetIDBits = killsSetIDBits
    }
    init(_ req: fuse_req_t) {
        if let ctx = fuse_req_ctx(req) {
            self.init(
                uid: ctx.pointee.uid, gid: ctx.pointee.gid, pid: ctx.pointee.pid,
                umask: FilePermissions(rawValue: ctx.pointee.umask),
                killsSetIDBits: RawProtocol.currentRequestKillsSetID)
        } else {
            self.init(uid: 0, gid: 0, pid: 0, umask: [])
        }
    }
}

// MARK: - Attributes

/// The type of a node (the `S_IFMT` bits of a mode).
public enum FileType: Sendable, Hashable {
    case regular, directory, symbolicLink, characterDevice, blockDevice, fifo, socket

    /// Decodes the `S_IFMT` bits of `mode`; nil for an unknown type.
    public init?(mode: UInt32) {
        switch mode & UInt32(Glibc.S_IFMT) {
        case UInt32(Glibc.S_IFREG): self = .regular
        case UInt32(Glibc.S_IFDIR): self = .directory
        case UInt32(Glibc.S_IFLNK): self = .symbolicLink
        case UInt32(Glibc.S_IFCHR): self = .characterDevice
        case UInt32(Glibc.S_IFBLK): self = .blockDevice
        case UInt32(Glibc.S_IFIFO): self = .fifo
        case UInt32(Glibc.S_IFSOCK): self = .socket
        default: return nil
        }
    }

    /// The `S_IFMT` bits.
    public var modeBits: UInt32 {
        switch self {
        case .regular: UInt32(Glibc.S_IFREG)
        case .directory: UInt32(Glibc.S_IFDIR)
        case .symbolicLink: UInt32(Glibc.S_IFLNK)
        case .characterDevice: UInt32(Glibc.S_IFCHR)
        case .blockDevice: UInt32(Glibc.S_IFBLK)
        case .fifo: UInt32(Glibc.S_IFIFO)
        case .socket: UInt32(Glibc.S_IFSOCK)
        }
    }
}

/// A point in time with nanoseconds, as in `struct timespec`.
public struct Timespec: Hashable, Comparable, Sendable {
    public var seconds: Int64
    public var nanoseconds: Int64
    public init(seconds: Int64, nanoseconds: Int64 = 0) {
        self.seconds = seconds
        self.nanoseconds = nanoseconds
    }
    init(_ ts: Glibc.timespec) { self.init(seconds: Int64(ts.tv_sec), nanoseconds: Int64(ts.tv_nsec)) }
    var cTimespec: Glibc.timespec { .init(tv_sec: Int(seconds), tv_nsec: Int(nanoseconds)) }
    /// The current wall-clock time (`CLOCK_REALTIME`).
    public static var now: Timespec {
        var ts = Glibc.timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        return Timespec(ts)
    }
    public static let zero = Timespec(seconds: 0)
    public static func < (a: Self, b: Self) -> Bool {
        (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds)
    }
}

/// The attributes of a node, sent in entry and attr replies.
public struct FileAttributes: Hashable, Sendable {
    /// `st_ino`; 0 means "use the node id of the reply".
    public var ino: UInt64
    public var type: FileType
    public var permissions: FilePermissions
    public var nlink: UInt32
    public var uid: UInt32
    public var gid: UInt32
    public var rdev: UInt64
    public var size: UInt64
    /// `st_blocks` in 512-byte units; nil means "computed from size".
    public var blocks: UInt64?
    public var blockSize: UInt32
    public var atime: Timespec
    public var mtime: Timespec
    public var ctime: Timespec

    public init(
        ino: UInt64 = 0, type: FileType, permissions: FilePermissions, nlink: UInt32 = 1,
        uid: UInt32 = 0, gid: UInt32 = 0, rdev: UInt64 = 0, size: UInt64 = 0,
        blocks: UInt64? = nil, blockSize: UInt32 = 4096,
        atime: Timespec = .zero, mtime: Timespec = .zero, ctime: Timespec = .zero
    ) {
        self.ino = ino
        self.type = type
        self.permissions = permissions
        self.nlink = nlink
        self.uid = uid
        self.gid = gid
        self.rdev = rdev
        self.size = size
        self.blocks = blocks
        self.blockSize = blockSize
        self.atime = atime
        self.mtime = mtime
        self.ctime = ctime
    }

    /// `st_mode`: type bits and permissions.
    public var mode: UInt32 { type.modeBits | UInt32(permissions.rawValue) }

    func stat(defaultIno: UInt64) -> stat {
        var st = Glibc.stat()
        st.st_ino = UInt(ino != 0 ? ino : defaultIno)
        st.st_mode = mode
        st.st_nlink = UInt(nlink)
        st.st_uid = uid
        st.st_gid = gid
        st.st_rdev = UInt(rdev)
        st.st_size = Int(clamping: size)
        st.st_blksize = Int(blockSize)
        st.st_blocks = Int(clamping: blocks ?? (size + 511) / 512)
        st.st_atim = atime.cTimespec
        st.st_mtim = mtime.cTimespec
        st.st_ctim = ctime.cTimespec
        return st
    }
}

/// A kernel entry reply: the node, its generation, attributes and how long the kernel may
/// cache the name (entry timeout) and the attributes (attr timeout).
public struct Entry: Hashable, Sendable {
    public var node: NodeID
    public var generation: Generation
    public var attributes: FileAttributes
    public var attributeTimeout: Duration
    public var entryTimeout: Duration
    public init(
        node: NodeID, generation: Generation = Generation(0), attributes: FileAttributes,
        attributeTimeout: Duration = .seconds(1), entryTimeout: Duration = .seconds(1)
    ) {
        self.node = node
        self.generation = generation
        self.attributes = attributes
        self.attributeTimeout = attributeTimeout
        self.entryTimeout = entryTimeout
    }

    var param: fuse_entry_param {
        var e = fuse_entry_param()
        e.ino = node.rawValue
        e.generation = generation.rawValue
        e.attr = attributes.stat(defaultIno: node.rawValue)
        e.attr_timeout = attributeTimeout.seconds
        e.entry_timeout = entryTimeout.seconds
        return e
    }
}

extension Duration {
    /// The duration in seconds, as libfuse's timeouts want it.
    var seconds: Double {
        let (s, atto) = components
        return max(0, Double(s) + Double(atto) * 1e-18)
    }
}

/// The attribute changes of a `setattr` request; nil fields are unchanged.
public struct SetAttributes: Hashable, Sendable {
    /// How a time is set: to the server's clock (`UTIME_NOW`) or to a given value.
    public enum TimeChange: Hashable, Sendable {
        case now
        case time(Timespec)
    }
    public var permissions: FilePermissions?
    public var uid: UInt32?
    public var gid: UInt32?
    /// New size (truncate or extend).
    public var size: UInt64?
    public var atime: TimeChange?
    public var mtime: TimeChange?
    public var ctime: Timespec?
    /// The handle when the change came through an open file (`ftruncate`, `fchmod`, …).
    public var handle: FileHandle?
    public init(
        permissions: FilePermissions? = nil, uid: UInt32? = nil, gid: UInt32? = nil,
        size: UInt64? = nil, atime: TimeChange? = nil, mtime: TimeChange? = nil,
        ctime: Timespec? = nil, handle: FileHandle? = nil
    ) {
        self.permissions = permissions
        self.uid = uid
        self.gid = gid
        self.size = size
        self.atime = atime
        self.mtime = mtime
        self.ctime = ctime
        self.handle = handle
    }

    init(_ st: stat, valid: Int32, handle: FileHandle?) {
        func has(_ flag: Int32) -> Bool { valid & flag != 0 }
        self.init(handle: handle)
        if has(FUSE_SET_ATTR_MODE) { permissions = FilePermissions(rawValue: st.st_mode & 0o7777) }
        if has(FUSE_SET_ATTR_UID) { uid = st.st_uid }
        if has(FUSE_SET_ATTR_GID) { gid = st.st_gid }
        if has(FUSE_SET_ATTR_SIZE) { size = UInt64(clamping: st.st_size) }
        if has(FUSE_SET_ATTR_ATIME_NOW) {
            atime = .now
        } else if has(FUSE_SET_ATTR_ATIME) {
            atime = .time(Timespec(st.st_atim))
        }
        if has(FUSE_SET_ATTR_MTIME_NOW) {
            mtime = .now
        } else if has(FUSE_SET_ATTR_MTIME) {
            mtime = .time(Timespec(st.st_mtim))
        }
        if has(FUSE_SET_ATTR_CTIME) { ctime = Timespec(st.st_ctim) }
    }
}

/// File system statistics for `statfs` (`struct statvfs`).
///
/// Report plausible, non-zero values: file managers refuse to copy onto a filesystem that
/// reports no free space.
public struct FileSystemStatistics: Hashable, Sendable {
    public var blockSize: UInt64
    public var fragmentSize: UInt64
    public var blocks: UInt64
    public var blocksFree: UInt64
    public var blocksAvailable: UInt64
    public var files: UInt64
    public var filesFree: UInt64
    public var filesAvailable: UInt64
    public var nameMax: UInt64
    public init(
        blockSize: UInt64 = 4096, fragmentSize: UInt64? = nil, blocks: UInt64, blocksFree: UInt64,
        blocksAvailable: UInt64? = nil, files: UInt64, filesFree: UInt64,
        filesAvailable: UInt64? = nil, nameMax: UInt64 = 255
    ) {
        self.blockSize = blockSize
        self.fragmentSize = fragmentSize ?? blockSize
        self.blocks = blocks
        self.blocksFree = blocksFree
        self.blocksAvailable = blocksAvailable ?? blocksFree
        self.files = files
        self.filesFree = filesFree
        self.filesAvailable = filesAvailable ?? filesFree
        self.nameMax = nameMax
    }

    /// What the default `statfs` reports: 1 TiB, all of it free, a million free inodes.
    public static let plausibleDefault = FileSystemStatistics(
        blocks: 1 << 28, blocksFree: 1 << 28, files: 1 << 20, filesFree: 1 << 20)

    var statvfs: statvfs {
        var s = Glibc.statvfs()
        s.f_bsize = UInt(blockSize)
        s.f_frsize = UInt(fragmentSize)
        s.f_blocks = fsblkcnt_t(blocks)
        s.f_bfree = fsblkcnt_t(blocksFree)
        s.f_bavail = fsblkcnt_t(blocksAvailable)
        s.f_files = fsfilcnt_t(files)
        s.f_ffree = fsfilcnt_t(filesFree)
        s.f_favail = fsfilcnt_t(filesAvailable)
        s.f_namemax = UInt(nameMax)
        return s
    }
}

// MARK: - Flags

/// `open(2)` flags as the kernel passes them to `open`, `create` and `opendir`.
public struct OpenFlags: OptionSet, Hashable, Sendable {
    public var rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// The access mode bits (`O_ACCMODE`).
    public enum AccessMode: Hashable, Sendable {
        case readOnly, writeOnly, readWrite
    }
    public var accessMode: AccessMode {
        switch rawValue & O_ACCMODE {
        case O_WRONLY: .writeOnly
        case O_RDWR: .readWrite
        default: .readOnly
        }
    }
    /// True for write-only and read-write opens.
    public var isWritable: Bool { accessMode != .readOnly }

    public static let writeOnly = OpenFlags(rawValue: O_WRONLY)
    public static let readWrite = OpenFlags(rawValue: O_RDWR)
    public static let append = OpenFlags(rawValue: O_APPEND)
    public static let create = OpenFlags(rawValue: O_CREAT)
    public static let exclusive = OpenFlags(rawValue: O_EXCL)
    public static let truncate = OpenFlags(rawValue: O_TRUNC)
    public static let nonBlocking = OpenFlags(rawValue: O_NONBLOCK)
    public static let sync = OpenFlags(rawValue: O_SYNC)
    public static let dataSync = OpenFlags(rawValue: O_DSYNC)
    public static let directory = OpenFlags(rawValue: O_DIRECTORY)
    public static let noFollow = OpenFlags(rawValue: O_NOFOLLOW)
    public static let closeOnExec = OpenFlags(rawValue: O_CLOEXEC)
    public static let direct = OpenFlags(rawValue: docfs_o_direct())
    public static let noAccessTime = OpenFlags(rawValue: docfs_o_noatime())
}

/// What an `open`/`opendir`/`create` reply asks of the kernel's caches for this open.
public struct OpenOptions: OptionSet, Hashable, Sendable {
    public var rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Bypass the page cache (`direct_io`): every read and write reaches the filesystem.
    /// Disables shared writable mmap and readahead.
    public static let directIO = OpenOptions(rawValue: 1 << 0)
    /// Keep the page cache from previous opens (`keep_cache`) instead of dropping it.
    public static let keepCache = OpenOptions(rawValue: 1 << 1)
    /// The file is not seekable (`nonseekable`).
    public static let nonSeekable = OpenOptions(rawValue: 1 << 2)
    /// Let the kernel cache this directory's entries (`cache_readdir`; `opendir` only).
    public static let cacheDirectory = OpenOptions(rawValue: 1 << 3)
    /// Do not send `flush` on close (`noflush`). Never set this on a file that saves on flush.
    public static let noFlush = OpenOptions(rawValue: 1 << 4)
}

/// `renameat2(2)` flags.
public struct RenameFlags: OptionSet, Hashable, Sendable {
    public var rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Fail with EEXIST if the target exists (`RENAME_NOREPLACE`).
    public static let noReplace = RenameFlags(rawValue: 1 << 0)
    /// Swap source and target atomically (`RENAME_EXCHANGE`).
    public static let exchange = RenameFlags(rawValue: 1 << 1)
    /// Leave a whiteout at the source (`RENAME_WHITEOUT`); answer EINVAL unless an overlay
    /// upper layer is being implemented.
    public static let whiteout = RenameFlags(rawValue: 1 << 2)
}

/// `fsync`/`fsyncdir` flags.
public struct FsyncFlags: OptionSet, Hashable, Sendable {
    public var rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Only the data must be durable, not the metadata (`fdatasync`).
    public static let dataSync = FsyncFlags(rawValue: 1)
}

/// `setxattr(2)` flags.
public struct XattrFlags: OptionSet, Hashable, Sendable {
    public var rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    /// Fail with EEXIST if the attribute exists (`XATTR_CREATE`).
    public static let create = XattrFlags(rawValue: 1)
    /// Fail with ENODATA if the attribute does not exist (`XATTR_REPLACE`).
    public static let replace = XattrFlags(rawValue: 2)
}

/// `access(2)` mask; empty means "does it exist" (`F_OK`).
public struct AccessMask: OptionSet, Hashable, Sendable {
    public var rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let read = AccessMask(rawValue: R_OK)
    public static let write = AccessMask(rawValue: W_OK)
    public static let execute = AccessMask(rawValue: X_OK)
}

/// `fallocate(2)` mode; empty is "allocate and extend".
public struct FallocateMode: OptionSet, Hashable, Sendable {
    public var rawValue: Int32
    public init(rawValue: Int32) { self.rawValue = rawValue }
    public static let keepSize = FallocateMode(rawValue: 0x01)
    public static let punchHole = FallocateMode(rawValue: 0x02)
    public static let collapseRange = FallocateMode(rawValue: 0x08)
    public static let zeroRange = FallocateMode(rawValue: 0x10)
    public static let insertRange = FallocateMode(rawValue: 0x20)
    public static let unshareRange = FallocateMode(rawValue: 0x40)
}

/// `lseek(2)` whence values the kernel forwards (it handles SET/CUR/END itself).
public enum SeekWhence: Hashable, Sendable {
    case set, current, end
    /// Next data at or after the offset (`SEEK_DATA`).
    case data
    /// Next hole at or after the offset (`SEEK_HOLE`).
    case hole
    case other(Int32)

    init(_ raw: Int32) {
        switch raw {
        case SEEK_SET: self = .set
        case SEEK_CUR: self = .current
        case SEEK_END: self = .end
        case 3: self = .data
        case 4: self = .hole
        default: self = .other(raw)
        }
    }
}

/// A POSIX record lock (`struct flock`), always relative to the start of the file.
public struct FileLock: Hashable, Sendable {
    public enum Kind: Hashable, Sendable {
        case read, write, unlock
    }
    public var kind: Kind
    /// First byte of the range.
    public var start: UInt64
    /// Last byte of the range (inclusive); `UInt64.max` means "to the end of the file".
    public var end: UInt64
    /// Process holding the lock (reported by `getlk`).
    public var pid: Int32
    public init(kind: Kind, start: UInt64, end: UInt64 = .max, pid: Int32 = 0) {
        self.kind = kind
        self.start = start
        self.end = end
        self.pid = pid
    }

    init(_ fl: flock) {
        switch Int32(fl.l_type) {
        case F_RDLCK: kind = .read
        case F_WRLCK: kind = .write
        default: kind = .unlock
        }
        // libfuse converts the kernel's [start, end] into l_start/l_len with l_len 0 = to EOF.
        start = UInt64(clamping: fl.l_start)
        end = fl.l_len == 0 ? .max : start &+ UInt64(clamping: fl.l_len) &- 1
        pid = fl.l_pid
    }

    var flock: flock {
        var fl = Glibc.flock()
        switch kind {
        case .read: fl.l_type = Int16(F_RDLCK)
        case .write: fl.l_type = Int16(F_WRLCK)
        case .unlock: fl.l_type = Int16(F_UNLCK)
        }
        fl.l_whence = Int16(SEEK_SET)
        fl.l_start = Int(clamping: start)
        fl.l_len = end == .max ? 0 : Int(clamping: end - start + 1)
        fl.l_pid = pid
        return fl
    }

    /// True if the two ranges overlap.
    public func overlaps(_ other: FileLock) -> Bool { start <= other.end && other.start <= end }
}

/// A `flock(2)` operation.
public enum FlockOperation: Hashable, Sendable {
    case shared(nonBlocking: Bool)
    case exclusive(nonBlocking: Bool)
    case unlock

    init(_ op: Int32) {
        let nonBlocking = op & LOCK_NB != 0
        switch op & ~LOCK_NB {
        case LOCK_SH: self = .shared(nonBlocking: nonBlocking)
        case LOCK_EX: self = .exclusive(nonBlocking: nonBlocking)
        default: self = .unlock
        }
    }
}

/// One entry of a `batchForget`.
public struct ForgetItem: Hashable, Sendable {
    public var node: NodeID
    /// How many lookups the kernel drops.
    public var lookups: UInt64
    public init(node: NodeID, lookups: UInt64) {
        self.node = node
        self.lookups = lookups
    }
}

/// Facts about a `write` request beyond its data.
public struct WriteInfo: Hashable, Sendable {
    /// The open flags of the handle.
    public var flags: OpenFlags
    /// A delayed write from the page cache (writeback cache or shared mmap): the request
    /// context is not valid and the handle may belong to another open of the same node.
    public var isWritePage: Bool
    public var lockOwner: LockOwner?
}

/// Facts about a `release` request.
public struct ReleaseInfo: Hashable, Sendable {
    public var flags: OpenFlags
    /// Set when the kernel also asks to flush (only with `noflush` on the open).
    public var flush: Bool
    /// Set when BSD (`flock`) locks held by ``lockOwner`` must be released.
    public var releaseFlockLocks: Bool
    public var lockOwner: LockOwner?
}
