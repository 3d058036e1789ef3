import CFuse3

/// The connection parameters negotiated in `INIT`, handed to ``FileSystem/initialize(_:)``.
///
/// Setters check each value against what the kernel (and libfuse 3.14) can do and throw a
/// ``Refusal`` instead of letting libfuse abort the mount with `EPROTO` or silently clamp.
public struct KernelConfig: Sendable {
    /// `FUSE_CAP_*` capabilities.
    public struct Capabilities: OptionSet, Hashable, Sendable {
        public var rawValue: UInt32
        public init(rawValue: UInt32) { self.rawValue = rawValue }
        public static let asyncRead = Self(rawValue: UInt32(FUSE_CAP_ASYNC_READ))
        /// Forward POSIX locks (`fcntl`) to ``FileSystem/getlk(_:node:handle:owner:lock:reply:)``
        /// and `setlk`; without it the kernel keeps them local.
        public static let posixLocks = Self(rawValue: UInt32(FUSE_CAP_POSIX_LOCKS))
        /// `open(O_TRUNC)` arrives as one open instead of setattr(size 0) + open.
        public static let atomicOpenTruncate = Self(rawValue: UInt32(FUSE_CAP_ATOMIC_O_TRUNC))
        /// Lookups of `.` and `..` (needed for NFS export).
        public static let exportSupport = Self(rawValue: UInt32(FUSE_CAP_EXPORT_SUPPORT))
        /// The kernel does not apply the umask: the filesystem does (``RequestContext/umask``).
        public static let dontMask = Self(rawValue: UInt32(FUSE_CAP_DONT_MASK))
        public static let spliceWrite = Self(rawValue: UInt32(FUSE_CAP_SPLICE_WRITE))
        public static let spliceMove = Self(rawValue: UInt32(FUSE_CAP_SPLICE_MOVE))
        public static let spliceRead = Self(rawValue: UInt32(FUSE_CAP_SPLICE_READ))
        /// Forward `flock(2)` to ``FileSystem/flock(_:node:handle:owner:operation:reply:)``.
        public static let flockLocks = Self(rawValue: UInt32(FUSE_CAP_FLOCK_LOCKS))
        public static let ioctlDirectory = Self(rawValue: UInt32(FUSE_CAP_IOCTL_DIR))
        /// Drop cached pages when a refreshed mtime or size changed.
        public static let autoInvalidateData = Self(rawValue: UInt32(FUSE_CAP_AUTO_INVAL_DATA))
        /// Use ``FileSystem/readdirplus(_:node:handle:offset:reply:)``.
        public static let readdirplus = Self(rawValue: UInt32(FUSE_CAP_READDIRPLUS))
        /// Let the kernel choose between readdir and readdirplus per call.
        public static let readdirplusAuto = Self(rawValue: UInt32(FUSE_CAP_READDIRPLUS_AUTO))
        public static let asyncDirectIO = Self(rawValue: UInt32(FUSE_CAP_ASYNC_DIO))
        /// Writes go to the page cache and reach the filesystem later, merged; the kernel then
        /// owns mtime, size and `O_APPEND`.
        public static let writebackCache = Self(rawValue: UInt32(FUSE_CAP_WRITEBACK_CACHE))
        public static let noOpenSupport = Self(rawValue: UInt32(FUSE_CAP_NO_OPEN_SUPPORT))
        /// Lookups and readdir in one directory run concurrently instead of one at a time.
        /// libfuse 3.14 never sends it, so this layer adds it to the INIT reply.
        public static let parallelDirectoryOps = Self(rawValue: UInt32(FUSE_CAP_PARALLEL_DIROPS))
        public static let posixACL = Self(rawValue: UInt32(FUSE_CAP_POSIX_ACL))
        /// The filesystem clears suid/sgid itself. libfuse 3.14 never sends it.
        public static let handleKillPriv = Self(rawValue: UInt32(FUSE_CAP_HANDLE_KILLPRIV))
        public static let cacheSymlinks = Self(rawValue: UInt32(FUSE_CAP_CACHE_SYMLINKS))
        public static let noOpendirSupport = Self(rawValue: UInt32(FUSE_CAP_NO_OPENDIR_SUPPORT))
        public static let explicitInvalidateData = Self(
            rawValue: UInt32(FUSE_CAP_EXPLICIT_INVAL_DATA))

        /// The filesystem clears set-user-ID and set-group-ID bits when
        /// ``RequestContext/killsSetIDBits`` asks (writes, truncations and `open(O_TRUNC)` by
        /// callers without `CAP_FSETID`, and every `chown`), and the kernel stops asking for
        /// `security.capability` before each write (`SB_NOSEC`). Not a libfuse bit: libfuse
        /// 3.14 does not know `FUSE_HANDLE_KILLPRIV_V2`, so this layer adds it to the INIT reply.
        public static let handleKillPrivV2 = Self(rawValue: 1 << 31)

        /// Wants libfuse 3.14's `do_init` accepts but never puts into the INIT reply.
        public static let droppedByLibfuse: Capabilities = [.handleKillPriv]
        /// Wants this layer clears before ``FileSystem/initialize(_:)``: libfuse turns them on
        /// because the C callbacks exist, but the Swift defaults answer `ENOSYS`.
        /// And `FUSE_PARALLEL_DIROPS`, which libfuse wants by default: only a filesystem that asks
        /// for it gets concurrent lookups in one directory.
        static let optIn: Capabilities = [
            .posixLocks, .flockLocks, .readdirplus, .readdirplusAuto, .parallelDirectoryOps,
        ]
        /// Capabilities this layer negotiates itself (``RawProtocol``), kept from libfuse.
        static let negotiatedHere: Capabilities = [.handleKillPrivV2]
    }

    /// Why a setter refused a value.
    public enum Refusal: Error, Hashable, Sendable {
        /// The kernel does not offer these capabilities.
        case notOffered(Capabilities)
        /// libfuse 3.14 accepts these but never tells the kernel.
        case droppedByLibfuse(Capabilities)
        /// The value is outside `range`.
        case outOfRange(value: Int, range: ClosedRange<Int>)
        /// ``KernelConfig/setTimeGranularity(nanoseconds:)`` needs a power of ten.
        case notPowerOfTen(Int)
    }

    /// The FUSE protocol version the kernel speaks.
    public let protocolVersion: (major: Int, minor: Int)
    /// What the kernel (and libfuse) can do.
    public let capable: Capabilities
    /// What will be enabled; change it with ``enable(_:)`` and ``disable(_:)``.
    public private(set) var wanted: Capabilities
    /// Largest WRITE request in bytes.
    public private(set) var maxWrite: Int
    /// Largest readahead window in bytes.
    public private(set) var maxReadahead: Int
    /// Background requests (readahead, async direct I/O) in flight at once; 0 = kernel default.
    public private(set) var maxBackground: Int
    /// Background requests at which the kernel considers the filesystem congested; 0 = ¾ of
    /// ``maxBackground``.
    public private(set) var congestionThreshold: Int
    /// Timestamp granularity in nanoseconds (with the writeback cache, the kernel sets times).
    public private(set) var timeGranularity: Int

    /// The largest `max_write` libfuse 3.14 can receive (its buffer holds 256 pages).
    public let maxWriteLimit: Int
    private let kernelMaxReadahead: Int

    init(_ conn: fuse_conn_info, offersKillPrivV2: Bool = false) {
        protocolVersion = (Int(conn.proto_major), Int(conn.proto_minor))
        capable = Capabilities(rawValue: conn.capable).subtracting(Capabilities.negotiatedHere)
            .union(offersKillPrivV2 ? .handleKillPrivV2 : [])
        wanted = Capabilities(rawValue: conn.want).subtracting(Capabilities.optIn)
            .subtracting(Capabilities.droppedByLibfuse)
        maxWrite = Int(conn.max_write)
        maxWriteLimit = Int(conn.max_write)
        maxReadahead = Int(conn.max_readahead)
        kernelMaxReadahead = Int(conn.max_readahead)
        maxBackground = Int(conn.max_background)
        congestionThreshold = Int(conn.congestion_threshold)
        timeGranularity = Int(conn.time_gran)
    }

    /// Writes the negotiated values back for libfuse to send.
    func apply(to conn: inout fuse_conn_info) {
        // Keep libfuse's own bits for the dropped wants: they are never sent anyway.
        let dropped = Capabilities(rawValue: conn.want).intersection(.droppedByLibfuse)
        conn.want = wanted.union(dropped).subtracting(Capabilities.negotiatedHere).rawValue
        conn.max_write = UInt32(maxWrite)
        conn.max_readahead = UInt32(maxReadahead)
        conn.max_background = UInt32(maxBackground)
        conn.congestion_threshold = UInt32(congestionThreshold)
        conn.time_gran = UInt32(timeGranularity)
    }

    /// Enables capabilities, all or none.
    ///
    /// - Throws: ``Refusal/notOffered(_:)`` for capabilities the kernel lacks,
    ///   ``Refusal/droppedByLibfuse(_:)`` for those libfuse 3.14 would not send.
    public mutating func enable(_ capabilities: Capabilities) throws(Refusal) {
        let dropped = capabilities.intersection(.droppedByLibfuse)
        guard dropped.isEmpty else { throw .droppedByLibfuse(dropped) }
        let missing = capabilities.subtracting(capable)
        guard missing.isEmpty else { throw .notOffered(missing) }
        wanted.formUnion(capabilities)
    }

    /// Disables capabilities (always allowed), e.g. `[.spliceRead, .spliceWrite, .spliceMove]`.
    public mutating func disable(_ capabilities: Capabilities) {
        wanted.subtract(capabilities)
    }

    /// Sets the largest WRITE request: 4 KiB up to ``maxWriteLimit`` (1 MiB with libfuse 3.14).
    public mutating func setMaxWrite(_ bytes: Int) throws(Refusal) {
        let range = 4096...maxWriteLimit
        guard range.contains(bytes) else { throw .outOfRange(value: bytes, range: range) }
        maxWrite = bytes
    }

    /// Sets the readahead window: 0 up to what the kernel offered (it can only be lowered).
    public mutating func setMaxReadahead(_ bytes: Int) throws(Refusal) {
        let range = 0...kernelMaxReadahead
        guard range.contains(bytes) else { throw .outOfRange(value: bytes, range: range) }
        maxReadahead = bytes
    }

    /// Sets the background request limit (1...65535; the kernel caps it for non-root mounts).
    public mutating func setMaxBackground(_ count: Int) throws(Refusal) {
        let range = 1...65535
        guard range.contains(count) else { throw .outOfRange(value: count, range: range) }
        maxBackground = count
        if congestionThreshold > count { congestionThreshold = 0 }
    }

    /// Sets the congestion threshold: 1 up to ``maxBackground`` (set that first).
    public mutating func setCongestionThreshold(_ count: Int) throws(Refusal) {
        let range = 1...max(1, maxBackground == 0 ? 65535 : maxBackground)
        guard range.contains(count) else { throw .outOfRange(value: count, range: range) }
        congestionThreshold = count
    }

    /// Sets the timestamp granularity: a power of ten from 1 ns to 1 s (1000 for microseconds).
    public mutating func setTimeGranularity(nanoseconds: Int) throws(Refusal) {
        let range = 1...1_000_000_000
        guard range.contains(nanoseconds) else {
            throw .outOfRange(value: nanoseconds, range: range)
        }
        var n = nanoseconds
        while n % 10 == 0 { n /= 10 }
        guard n == 1 else { throw .notPowerOfTen(nanoseconds) }
        timeGranularity = nanoseconds
    }
}
