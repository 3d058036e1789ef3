import CLinuxSupport
import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// Where a regular-file wrapper's bytes come from.
///
/// A source is read by range, so contents never have to sit in memory whole: the disk reader,
/// the document store and the file system all supply their own source behind
/// ``FileWrapper/regularFileContents``. Sources are immutable values: a wrapper with new contents
/// gets a new source.
public protocol ContentsSource: Sendable {
    /// The number of bytes.
    var count: Int64 { get }

    /// Reads up to `count` bytes starting at `offset`. The result is shorter only at the end of
    /// the contents, and empty at or past it.
    func read(offset: Int64, count: Int) throws -> Data

    /// All the bytes. Sources may map them instead of copying.
    func data() throws -> Data

    /// Writes all the bytes to `fd` at its current position; returns the number written.
    func write(to fd: FileDescriptor) throws -> Int64

    /// Whether a range read twice gives the same bytes for as long as the source lives (bytes
    /// in memory, a frozen snapshot; not a file others may change). A store may then cut and
    /// hash new contents before its write transaction and read them again inside it.
    var isStable: Bool { get }

    /// For a store's ``ContentUpdate/sparse(size:chunks:source:)`` and
    /// ``ContentUpdate/derived(from:size:chunks:source:)``: the byte ranges (ascending, disjoint)
    /// outside which the source's bytes are those of the file the update starts from, or nil
    /// when any byte of a listed chunk may differ. A store then cuts and hashes again only
    /// around these ranges, not every listed chunk.
    var changedRanges: [Range<Int64>]? { get }

    /// For the same updates: the byte ranges (ascending, disjoint) the source can read, or nil
    /// when it can read every byte of every listed chunk. They cover ``changedRanges`` (all of
    /// each listed chunk, when that is nil); a store reads the rest of a listed chunk from the
    /// file the update starts from, whose bytes those are.
    var heldRanges: [Range<Int64>]? { get }

    /// The store's work on these bytes done while they were written
    /// (`FileSystemStore.prepareContents(reading:)` in VersionedStore), which a save of them finishes and takes
    /// when it still holds; nil when there is none.
    var preparation: (any ContentsPreparation)? { get }
}

extension ContentsSource {
    public var isStable: Bool { false }
    public var changedRanges: [Range<Int64>]? { nil }
    public var heldRanges: [Range<Int64>]? { nil }
    public var preparation: (any ContentsPreparation)? { nil }

    public func data() throws -> Data {
        guard count <= Int64(Int.max) else { throw FileWrapperError.contentsTooLarge(count) }
        return try read(offset: 0, count: Int(count))
    }

    public func write(to fd: FileDescriptor) throws -> Int64 {
        let step = 1 << 20
        var offset: Int64 = 0
        while offset < count {
            let chunk = try read(offset: offset, count: Int(min(Int64(step), count - offset)))
            if chunk.isEmpty { break }
            try POSIX.writeAll(fd.rawValue, chunk)
            offset += Int64(chunk.count)
        }
        return offset
    }
}

/// Contents held in memory.
public struct DataContentsSource: ContentsSource {
    /// The bytes.
    public let bytes: Data

    /// Wraps `bytes`.
    public init(_ bytes: Data) { self.bytes = bytes }

    public var count: Int64 { Int64(bytes.count) }
    public var isStable: Bool { true }

    public func read(offset: Int64, count: Int) throws -> Data {
        guard offset >= 0, count >= 0 else {
            throw FileWrapperError.invalidRange(offset: offset, count: count)
        }
        guard offset < Int64(bytes.count) else { return Data() }
        let start = bytes.startIndex + Int(offset)
        let end = start + min(count, bytes.count - Int(offset))
        return bytes.subdata(in: start..<end)
    }

    public func data() throws -> Data { bytes }

    public func write(to fd: FileDescriptor) throws -> Int64 {
        try POSIX.writeAll(fd.rawValue, bytes)
        return Int64(bytes.count)
    }
}

/// The identity of a file on disk, used to notice that a lazily read file changed or was
/// replaced before its contents were loaded.
struct FileIdentity: Sendable, Equatable {
    var device: UInt64
    var inode: UInt64
    var size: Int64
    var mtimeSeconds: Int
    var mtimeNanoseconds: Int

    init(_ st: stat) {
        device = UInt64(st.st_dev)
        inode = UInt64(st.st_ino)
        size = Int64(st.st_size)
        mtimeSeconds = st.st_mtim.tv_sec
        mtimeNanoseconds = st.st_mtim.tv_nsec
    }

    func sameFile(as st: stat) -> Bool {
        device == UInt64(st.st_dev) && inode == UInt64(st.st_ino)
    }
}

/// Contents of a file on disk, read lazily and by range.
///
/// Every read reopens the path and checks that it is still the file that was read at init
/// (same device, inode, size and modification time); otherwise it throws
/// ``FileWrapperError/contentsChangedOnDisk(path:)`` rather than return bytes of another version.
public struct DiskContentsSource: ContentsSource {
    /// The file's path.
    public let path: String
    let identity: FileIdentity
    /// Whether ``data()`` may memory-map the file.
    public let mayMap: Bool

    init(path: String, identity: FileIdentity, mayMap: Bool) {
        self.path = path
        self.identity = identity
        self.mayMap = mayMap
    }

    /// A source for the regular file at `path` as it is now.
    public init(path: String, mayMap: Bool = false) throws {
        let st: stat
        do { st = try POSIX.lstat(path) } catch { throw FileWrapperError.readFailed(path: path, error) }
        guard (st.st_mode & S_IFMT) == S_IFREG else { throw FileWrapperError.notARegularFile(path: path) }
        self.init(path: path, identity: FileIdentity(st), mayMap: mayMap)
    }

    public var count: Int64 { identity.size }

    func openChecked() throws -> Int32 {
        let fd: Int32
        do { fd = try POSIX.open(path, O_RDONLY | O_NOFOLLOW) } catch {
            if error == .noSuchFileOrDirectory || error == .tooManySymbolicLinkLevels {
                throw FileWrapperError.contentsChangedOnDisk(path: path)
            }
            throw FileWrapperError.readFailed(path: path, error)
        }
        do {
            let st = try POSIX.fstat(fd)
            guard FileIdentity(st) == identity else {
                POSIX.close(fd)
                throw FileWrapperError.contentsChangedOnDisk(path: path)
            }
        } catch let error as Errno {
            POSIX.close(fd)
            throw FileWrapperError.readFailed(path: path, error)
        }
        return fd
    }

    public func read(offset: Int64, count: Int) throws -> Data {
        guard offset >= 0, count >= 0 else {
            throw FileWrapperError.invalidRange(offset: offset, count: count)
        }
        let available = max(0, identity.size - offset)
        let wanted = Int(min(Int64(count), available))
        if wanted == 0 { return Data() }
        let fd = try openChecked()
        defer { POSIX.close(fd) }
        var data = Data(count: wanted)
        let n: Int
        do {
            n = try data.withUnsafeMutableBytes { raw in try POSIX.pread(fd, into: raw, offset: offset) }
        } catch { throw FileWrapperError.readFailed(path: path, error as? Errno ?? .ioError) }
        if n < wanted { data.removeSubrange(n..<wanted) }
        return data
    }

    public func data() throws -> Data {
        if mayMap && identity.size > 0 {
            let fd = try openChecked()
            POSIX.close(fd)
            do {
                return try Data(contentsOf: URL(fileURLWithPath: path), options: .alwaysMapped)
            } catch {
                throw FileWrapperError.readFailed(path: path, .ioError)
            }
        }
        guard identity.size <= Int64(Int.max) else { throw FileWrapperError.contentsTooLarge(identity.size) }
        return try read(offset: 0, count: Int(identity.size))
    }

    public func write(to fd: FileDescriptor) throws -> Int64 {
        let source = try openChecked()
        defer { POSIX.close(source) }
        // copy_file_range lets the kernel copy (or reflink) without passing bytes through us.
        var copied: Int64 = 0
        while copied < identity.size {
            let n = docfs_copy_file_range(source, fd.rawValue, Int(min(identity.size - copied, 1 << 30)))
            if n > 0 {
                copied += Int64(n)
                continue
            }
            if n == 0 { break }
            let e = Errno(rawValue: errno)
            if e == .interrupted { continue }
            if copied == 0
                && [.noFunction, .improperLink, .invalidArgument, .notSupported, .badFileDescriptor].contains(
                    e)
            {
                return try streamCopy(from: source, to: fd.rawValue)
            }
            throw FileWrapperError.readFailed(path: path, e)
        }
        return copied
    }

    private func streamCopy(from source: Int32, to target: Int32) throws -> Int64 {
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        var offset: Int64 = 0
        while true {
            let n: Int
            do {
                n = try buffer.withUnsafeMutableBytes { raw in
                    try POSIX.pread(source, into: raw, offset: offset)
                }
            } catch { throw FileWrapperError.readFailed(path: path, error as? Errno ?? .ioError) }
            if n == 0 { return offset }
            do {
                try buffer.withUnsafeBytes { raw in
                    try POSIX.writeAll(target, UnsafeRawBufferPointer(rebasing: raw[0..<n]))
                }
            } catch { throw FileWrapperError.writeFailed(path: path, error as? Errno ?? .ioError) }
            offset += Int64(n)
        }
    }
}
