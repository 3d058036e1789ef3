import CFuse3
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// The parts of the kernel's protocol (7.33+) that libfuse 3.14 neither sends nor passes on:
/// `FUSE_HANDLE_KILLPRIV_V2` and `FUSE_PARALLEL_DIROPS` in the INIT reply, and the flags by
/// which the kernel asks the filesystem to clear set-user-ID and set-group-ID bits.
///
/// With `FUSE_HANDLE_KILLPRIV_V2` the kernel marks the superblock `SB_NOSEC`: once it has
/// seen that a file has no `security.capability`, its writes stop asking for it. Without it
/// every `write(2)` through the writeback cache costs a GETXATTR round trip first.
///
/// The session reads and writes the device through libfuse's custom I/O hooks, which see the
/// raw bytes: a request's flags are noted for the worker thread that goes on to handle it, and
/// the INIT reply gains the flag the filesystem asked for.
enum RawProtocol {
    /// `FUSE_HANDLE_KILLPRIV_V2` in `fuse_init_in.flags` and `fuse_init_out.flags`.
    static let handleKillPrivV2: UInt32 = 1 << 28
    /// `FUSE_PARALLEL_DIROPS` in `fuse_init_out.flags` (libfuse sees the kernel offer it).
    static let parallelDirops: UInt32 = 1 << 18

    // Opcodes and offsets from <linux/fuse.h>: the header is 40 bytes; then the request's
    // argument. libfuse 3.14 reads the same layout.
    private static let inHeaderSize = 40
    private static let outHeaderSize = 16
    private static let opcodeSetattr: UInt32 = 4
    private static let opcodeOpen: UInt32 = 14
    private static let opcodeWrite: UInt32 = 16
    private static let opcodeInit: UInt32 = 26
    /// `fuse_setattr_in.valid` (offset 0) & `FATTR_KILL_SUIDGID`.
    private static let setattrKillSUIDGID: UInt32 = 1 << 11
    /// `fuse_open_in.open_flags` (offset 4) & `FUSE_OPEN_KILL_SUIDGID`.
    private static let openKillSUIDGID: UInt32 = 1 << 0
    /// `fuse_write_in.write_flags` (offset 20) & `FUSE_WRITE_KILL_SUIDGID`.
    private static let writeKillSUIDGID: UInt32 = 1 << 2
    /// `fuse_init_in.flags` and `fuse_init_out.flags` (offset 12 in both).
    private static let initFlagsOffset = 12

    /// Per worker thread: whether the request it is handling asks to clear the bits.
    private static let killKey: pthread_key_t = {
        var key = pthread_key_t()
        pthread_key_create(&key, nil)
        return key
    }()

    /// Whether the request this thread is handling asks the filesystem to clear set-ID bits.
    static var currentRequestKillsSetID: Bool { pthread_getspecific(killKey) != nil }

    /// libfuse's hooks for this session's device: plain `read` and `writev`, looking at the bytes.
    static let io: fuse_custom_io = {
        var io = fuse_custom_io()
        io.read = { fd, buffer, length, userdata in
            let count = Glibc.read(fd, buffer, length)
            let saved = errno
            if count > 0, let buffer {
                received(UnsafeRawBufferPointer(start: buffer, count: count), userdata)
            }
            errno = saved
            return count
        }
        io.writev = { fd, iov, count, userdata in
            if let iov, let userdata { sending(iov, Int(count), SessionCore.from(userdata)) }
            return Glibc.writev(fd, iov, count)
        }
        return io
    }()

    /// Notes what a request just read from the device carries.
    private static func received(_ bytes: UnsafeRawBufferPointer, _ userdata: UnsafeMutableRawPointer?) {
        guard bytes.count >= inHeaderSize else { return }
        let opcode = bytes.loadUnaligned(fromByteOffset: 4, as: UInt32.self)
        func argument(_ offset: Int) -> UInt32 {
            let at = inHeaderSize + offset
            guard bytes.count >= at + 4 else { return 0 }
            return bytes.loadUnaligned(fromByteOffset: at, as: UInt32.self)
        }
        let kills: Bool
        switch opcode {
        case opcodeWrite: kills = argument(20) & writeKillSUIDGID != 0
        case opcodeSetattr: kills = argument(0) & setattrKillSUIDGID != 0
        case opcodeOpen: kills = argument(4) & openKillSUIDGID != 0
        case opcodeInit:
            kills = false
            guard let userdata else { break }
            SessionCore.from(userdata).kernelInit.withLock {
                $0.unique = bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
                $0.offered = argument(initFlagsOffset) & handleKillPrivV2 != 0
            }
        default: kills = false
        }
        pthread_setspecific(killKey, kills ? UnsafeRawPointer(bitPattern: 1) : nil)
    }

    /// Adds the flags the filesystem asked for to the INIT reply, which libfuse built without them.
    private static func sending(_ iov: UnsafeMutablePointer<iovec>, _ count: Int, _ core: SessionCore) {
        guard core.initReplyPending.load(ordering: .acquiring), count >= 2,
            iov[0].iov_len >= outHeaderSize, iov[1].iov_len >= initFlagsOffset + 4,
            let header = iov[0].iov_base, let body = iov[1].iov_base
        else { return }
        let (unique, flags) = core.kernelInit.withLock { ($0.unique, $0.replyFlags) }
        guard header.loadUnaligned(fromByteOffset: 8, as: UInt64.self) == unique,
            header.loadUnaligned(fromByteOffset: 4, as: Int32.self) == 0
        else { return }
        let old = body.loadUnaligned(fromByteOffset: initFlagsOffset, as: UInt32.self)
        body.storeBytes(of: old | flags, toByteOffset: initFlagsOffset, as: UInt32.self)
        core.initReplyPending.store(false, ordering: .releasing)
    }
}
