import CLinuxSupport
import FUSE
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// The bytes of one file that nobody has made durable yet: whole 4 KiB pages over the backing
/// file, and the file's size. Reads see the pages where there are some and the backing file
/// elsewhere; only ``persist(to:dataOnly:)`` (an `fsync`) writes them to the backing file.
///
/// Invariant: `backingEnd <= size`. Below `backingEnd` a byte no page covers is the backing
/// file's; at or above it, such a byte is zero (the file was truncated below it, or grew).
struct FileOverlay {
    static let pageSize = 4096

    /// The file's size as the mount shows it.
    private(set) var size: UInt64
    /// Where the backing file's bytes stop counting (see the invariant).
    private(set) var backingEnd: UInt64
    /// Changed pages by index, each `pageSize` bytes.
    private var pages: [UInt64: [UInt8]] = [:]
    /// The modification time the mount shows, set by writes, truncations and `utimensat`.
    var modified: Timespec

    /// An overlay of a backing file of `size` bytes with nothing changed yet.
    init(backingSize size: UInt64, modified: Timespec) {
        self.size = size
        backingEnd = size
        self.modified = modified
    }

    /// Bytes an `fsync` would write (changed pages).
    var pendingBytes: Int { pages.count * Self.pageSize }

    private static func page(_ offset: UInt64) -> UInt64 { offset / UInt64(pageSize) }

    /// The page `index` as the mount shows it (from the overlay, else the backing file).
    private func currentPage(_ index: UInt64, backing fd: Int32) throws(Errno) -> [UInt8] {
        if let page = pages[index] { return page }
        var page = [UInt8](repeating: 0, count: Self.pageSize)
        let start = index * UInt64(Self.pageSize)
        if start < backingEnd {
            try Backing.read(
                fd, into: &page, count: Int(min(UInt64(Self.pageSize), backingEnd - start)), at: start)
        }
        return page
    }

    /// Up to `count` bytes at `offset`, as the mount shows them.
    func read(at offset: UInt64, count: Int, backing fd: Int32) throws(Errno) -> [UInt8] {
        guard offset < size, count > 0 else { return [] }
        let end = min(size, offset + UInt64(count))
        var result = [UInt8](repeating: 0, count: Int(end - offset))
        let fromBacking = min(end, backingEnd)
        if fromBacking > offset {
            try Backing.read(fd, into: &result, count: Int(fromBacking - offset), at: offset)
        }
        var index = Self.page(offset)
        while index * UInt64(Self.pageSize) < end {
            if let page = pages[index] {
                let pageStart = index * UInt64(Self.pageSize)
                let from = max(offset, pageStart)
                let to = min(end, pageStart + UInt64(Self.pageSize))
                result.replaceSubrange(
                    Int(from - offset)..<Int(to - offset),
                    with: page[Int(from - pageStart)..<Int(to - pageStart)])
            }
            index += 1
        }
        return result
    }

    /// Writes `bytes` at `offset`, growing the file if they end past it.
    mutating func write(_ bytes: UnsafeRawBufferPointer, at offset: UInt64, backing fd: Int32) throws(Errno) {
        guard !bytes.isEmpty else { return }
        let end = offset + UInt64(bytes.count)
        var index = Self.page(offset)
        while index * UInt64(Self.pageSize) < end {
            let pageStart = index * UInt64(Self.pageSize)
            let from = max(offset, pageStart)
            let to = min(end, pageStart + UInt64(Self.pageSize))
            var page: [UInt8]
            if from == pageStart && to == pageStart + UInt64(Self.pageSize) {
                page = [UInt8](repeating: 0, count: Self.pageSize)
            } else {
                page = try currentPage(index, backing: fd)
            }
            let source = UnsafeRawBufferPointer(rebasing: bytes[Int(from - offset)..<Int(to - offset)])
            page.withUnsafeMutableBytes { raw in
                UnsafeMutableRawBufferPointer(rebasing: raw[Int(from - pageStart)..<Int(to - pageStart)])
                    .copyMemory(from: source)
            }
            pages[index] = page
            index += 1
        }
        size = max(size, end)
    }

    /// Sets the size: bytes past a new, smaller size are gone (zeros if it grows again).
    mutating func truncate(to newSize: UInt64) {
        if newSize < size {
            pages = pages.filter { $0.key * UInt64(Self.pageSize) < newSize }
            let cut = Int(newSize % UInt64(Self.pageSize))
            let last = Self.page(newSize)
            if cut > 0, var page = pages[last] {
                for i in cut..<Self.pageSize { page[i] = 0 }
                pages[last] = page
            }
            backingEnd = min(backingEnd, newSize)
        }
        size = newSize
    }

    /// Makes `count` bytes at `offset` read as zeros (within the size; `FALLOC_FL_PUNCH_HOLE`,
    /// `FALLOC_FL_ZERO_RANGE`).
    mutating func zero(at offset: UInt64, count: UInt64, backing fd: Int32) throws(Errno) {
        let end = min(size, offset + count)
        guard end > offset else { return }
        let zeros = [UInt8](repeating: 0, count: Self.pageSize)
        var at = offset
        while at < end {
            let pageEnd = (Self.page(at) + 1) * UInt64(Self.pageSize)
            let chunk = Int(min(end, pageEnd) - at)
            var failure: Errno?
            zeros.withUnsafeBytes { raw in
                do throws(Errno) {
                    try write(UnsafeRawBufferPointer(rebasing: raw[..<chunk]), at: at, backing: fd)
                } catch {
                    failure = error
                }
            }
            if let failure { throw failure }
            at += UInt64(chunk)
        }
    }

    /// Writes the overlay into the backing file and syncs it (`fdatasync` when `dataOnly`).
    func persist(to fd: Int32, dataOnly: Bool) throws(Errno) {
        if try Backing.stat(fd).st_size > off_t(backingEnd) {
            try Backing.check(ftruncate(fd, off_t(backingEnd)))
        }
        for index in pages.keys.sorted() {
            let start = index * UInt64(Self.pageSize)
            guard start < size, let page = pages[index] else { continue }
            try Backing.write(fd, page, count: Int(min(UInt64(Self.pageSize), size - start)), at: start)
        }
        try Backing.check(ftruncate(fd, off_t(size)))
        var times = [
            timespec(tv_sec: 0, tv_nsec: docfs_utime_omit()),
            timespec(tv_sec: Int(modified.seconds), tv_nsec: Int(modified.nanoseconds)),
        ]
        try Backing.check(futimens(fd, &times))
        try Backing.check(dataOnly ? fdatasync(fd) : fsync(fd))
    }
}
