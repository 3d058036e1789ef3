import CLinuxSupport
import DocumentEngine
import Foundation
import Synchronization
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Where spill files come from: unnamed files in one folder, kept for reuse when a layer lets
/// its file go. Making one costs the file system an inode allocation, which on ext4 took a
/// quarter of the daemon's time under fsx (a new layer after every save).
///
/// Small layers live in memory instead (``SpillLayer``), within ``memoryBudget``: creating
/// 10,000 small files made as many spill files, and ext4's search for a free inode among the
/// recently freed ones was half the daemon's CPU.
final class SpillFiles: Sendable {
    let directory: String
    private let idle = Mutex<[Int32]>([])
    /// At most this many idle files, each at most `largestKept` bytes long (its blocks stay
    /// taken until it is reused).
    static let keptIdle = 16
    static let largestKept: Int64 = 4 << 20
    /// A layer stays in memory while everything written to it lies below this offset.
    static let memoryLayerLimit = 256 << 10
    /// Bytes all layers may keep in memory together.
    let memoryBudget: Int
    private let memoryUsed = Atomic(0)
    /// Pages copied from a lower layer into the one taking a change, since the mount began.
    private let copies = Atomic(0)

    init(directory: String, memoryBudget: Int = 16 << 20) {
        self.directory = directory
        self.memoryBudget = memoryBudget
    }

    /// Bytes of memory used by layers now.
    var memoryInUse: Int { memoryUsed.load(ordering: .relaxed) }

    /// Takes `count` bytes of the memory budget; false when they would exceed it.
    func reserve(_ count: Int) -> Bool {
        var used = memoryUsed.load(ordering: .relaxed)
        while true {
            guard used + count <= memoryBudget else { return false }
            let (exchanged, original) = memoryUsed.compareExchange(
                expected: used, desired: used + count, ordering: .relaxed)
            if exchanged { return true }
            used = original
        }
    }

    /// Gives back `count` bytes of the memory budget.
    func release(_ count: Int) { memoryUsed.subtract(count, ordering: .relaxed) }

    /// Pages copied from a lower layer into the one taking a change, since the mount began.
    var chunksCopied: Int { copies.load(ordering: .relaxed) }

    func countCopy() { copies.add(1, ordering: .relaxed) }

    deinit {
        for fd in idle.withLock({ $0 }) { Glibc.close(fd) }
    }

    /// An empty spill file: an idle one emptied, or a new one.
    func take() throws(Errno) -> Int32 {
        while let fd = idle.withLock({ $0.popLast() }) {
            if ftruncate(fd, 0) == 0 { return fd }
            Glibc.close(fd)
        }
        var opened = docfs_open_tmpfile(directory)
        if opened < 0 {
            // No O_TMPFILE here (some file systems): a named file, unlinked at once.
            var template = Array("\(directory)/.docfs-spill-XXXXXX".utf8CString)
            opened = mkstemp(&template)
            if opened >= 0 { template.withUnsafeBufferPointer { _ = unlink($0.baseAddress!) } }
        }
        guard opened >= 0 else { throw Errno(rawValue: errno) }
        return opened
    }

    /// Takes back a file no layer uses: kept if small and there is room, else closed on another
    /// thread (closing frees its blocks). A kept one is emptied when taken again. Either way no
    /// disk work happens here, since a layer may be let go under the file system's lock.
    func give(_ fd: Int32) {
        var st = stat()
        let small = fstat(fd, &st) == 0 && Int64(st.st_size) <= Self.largestKept
        if small
            && idle.withLock({ idle in
                guard idle.count < Self.keptIdle else { return false }
                idle.append(fd)
                return true
            })
        {
            return
        }
        DispatchQueue.global(qos: .utility).async { _ = Glibc.close(fd) }
    }
}

/// A set of page numbers (≥ 0) as bits of 64-page words: the pages of a 1 GiB file take 32 KiB
/// whether they were written in order or not, and come out as runs in order.
struct PageSet: Sendable {
    private var words: [Int: UInt64] = [:]
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    func contains(_ page: Int) -> Bool {
        page >= 0 && (words[page >> 6] ?? 0) & (1 << UInt64(page & 63)) != 0
    }

    mutating func insert(_ page: Int) {
        let bit: UInt64 = 1 << UInt64(page & 63)
        let word = words[page >> 6] ?? 0
        if word & bit == 0 {
            words[page >> 6] = word | bit
            count += 1
        }
    }

    /// Inserts every page of `pages`, a word at a time.
    mutating func insert(_ pages: Range<Int>) {
        var page = pages.lowerBound
        while page < pages.upperBound {
            let index = page >> 6
            let first = page & 63
            let last = min(63, pages.upperBound - 1 - (index << 6))
            let mask = (UInt64.max >> UInt64(63 - last)) & (UInt64.max << UInt64(first))
            let word = words[index] ?? 0
            count += (mask & ~word).nonzeroBitCount
            words[index] = word | mask
            page = (index + 1) << 6
        }
    }

    /// Removes the pages at or past `first` (≥ 0), a word at a time (it runs under the mount's
    /// lock); returns them as runs, in order.
    mutating func removeAll(from first: Int) -> [Range<Int>] {
        let gone = runs().compactMap { run -> Range<Int>? in
            run.upperBound > first ? max(run.lowerBound, first)..<run.upperBound : nil
        }
        let firstWord = first >> 6
        for index in words.keys where index >= firstWord {
            guard let word = words[index] else { continue }
            // In the first word, the bits below `first` stay.
            let keep: UInt64 =
                index == firstWord && first & 63 != 0 ? UInt64.max >> UInt64(64 - (first & 63)) : 0
            count -= (word & ~keep).nonzeroBitCount
            words[index] = word & keep == 0 ? nil : word & keep
        }
        return gone
    }

    /// The pages as runs of consecutive pages, in order.
    func runs() -> [Range<Int>] {
        var result: [Range<Int>] = []
        for index in words.keys.sorted() {
            guard var word = words[index] else { continue }
            while word != 0 {
                let start = word.trailingZeroBitCount
                let length = (~(word >> UInt64(start))).trailingZeroBitCount
                let run = (index << 6 + start)..<(index << 6 + start + length)
                if let last = result.last, last.upperBound == run.lowerBound {
                    result[result.count - 1] = last.lowerBound..<run.upperBound
                } else {
                    result.append(run)
                }
                word = start + length == 64 ? 0 : word & (UInt64.max << UInt64(start + length))
            }
        }
        return result
    }
}

/// Written pages of one file, kept in an unnamed local file (the spill) rather than in memory,
/// so a large write costs disk, not RAM; a small file's are kept in memory, within the mount's
/// budget (``SpillFiles/memoryBudget``), and move to a spill file when a write goes past
/// ``SpillFiles/memoryLayerLimit`` or the budget is spent.
///
/// Invariant: every byte of the spill outside ``pages`` reads as zero (dropped pages are
/// punched out), so a page can be taken into the layer by writing only what it must keep.
///
/// The layer is part of the view (reached through ``FileContents``, under the view lock):
/// ``pages`` and ``cut`` say which of its bytes count, and change only while the layer is on top
/// and not frozen. The bytes themselves are its ``bytes``, which requests read and write without
/// the view lock (``FileContents/ChangePlan``, ``FileContents/ReadPlan``).
final class SpillLayer {
    private(set) var pages = PageSet()
    /// The byte ranges changes wrote or zeroed in the layer, ascending, disjoint and apart (not
    /// the old bytes it took in with a page): where a save cuts the file into chunks again.
    /// Past ``writtenLimit`` ranges, whole pages are counted instead (``writtenPages``).
    private var written: [Range<Int64>] = []
    /// The pages changes wrote, once ``written`` had too many ranges to keep in order.
    private var writtenPages: PageSet?
    static let writtenLimit = 1024
    /// Bytes at or past `cut` in the layers below (and the base) read as zeros: the smallest size
    /// the file was truncated to while this layer was on top.
    var cut: Int64 = .max
    /// Takes no more writes: an undone change may have left bytes outside ``pages``.
    var sealed = false
    /// Holds the base's own bytes for its pages (the layer a save stored, kept as a cache of
    /// them): not a change, until the next change reopens it (``reopen()``).
    var clean = false
    /// Where the layer's bytes are; also its identity outside the lock.
    let bytes: SpillBytes

    init(files: SpillFiles) { bytes = SpillBytes(files: files) }

    var isEmpty: Bool { pages.isEmpty && cut == .max }

    func contains(_ page: Int) -> Bool { pages.contains(page) }

    /// The layer as a save reads it once frozen: frozen layers never change, so this is a copy
    /// of nothing but references.
    var frozen: FrozenLayer {
        FrozenLayer(
            bytes: bytes, pages: pages, cut: cut, clean: clean, written: written, writtenPages: writtenPages)
    }

    /// Makes a clean layer take changes again (on top and not frozen). Its bytes are the base's,
    /// so nothing in it is written yet; and the base reads as zeros past any cut the layer kept,
    /// so it needs none.
    func reopen() {
        clean = false
        written = []
        writtenPages = nil
        cut = .max
    }

    /// What ``markWritten(_:pageSize:)`` recorded: byte ranges, or whole pages after many.
    func writtenRanges(pageSize: Int) -> [Range<Int64>] {
        frozen.writtenRanges(pageSize: pageSize)
    }

    /// Marks pages as part of the layer.
    func add(_ page: Int) { pages.insert(page) }

    /// Records that a change wrote `range`.
    func markWritten(_ range: Range<Int64>, pageSize: Int) {
        guard !range.isEmpty else { return }
        let size = Int64(pageSize)
        if writtenPages != nil {
            writtenPages?.insert(Int(range.lowerBound / size)..<Int((range.upperBound + size - 1) / size))
            return
        }
        // The first range that ends at or past the new one's start, and the first that starts
        // past its end: those between merge with it.
        var low = 0
        var high = written.count
        while low < high {
            let middle = (low + high) / 2
            if written[middle].upperBound < range.lowerBound { low = middle + 1 } else { high = middle }
        }
        var end = low
        var merged = range
        while end < written.count, written[end].lowerBound <= range.upperBound {
            let other = written[end]
            merged = min(merged.lowerBound, other.lowerBound)..<max(merged.upperBound, other.upperBound)
            end += 1
        }
        written.replaceSubrange(low..<end, with: [merged])
        // Random writes all over a large file: each insertion would move thousands of ranges.
        // Whole pages keep it cheap and still name only pages the layer holds.
        if written.count > Self.writtenLimit {
            var pages = PageSet()
            for range in written {
                pages.insert(Int(range.lowerBound / size)..<Int((range.upperBound + size - 1) / size))
            }
            writtenPages = pages
            written = []
        }
    }

    /// Unmarks the pages at or past `first`, returned as runs; their bytes must be zeroed after.
    func removeAll(from first: Int) -> [Range<Int>] { pages.removeAll(from: first) }
}

/// What a save reads of a frozen ``SpillLayer``: a value, so that it crosses to the store's
/// threads without the view.
struct FrozenLayer: Sendable {
    let bytes: SpillBytes
    let pages: PageSet
    let cut: Int64
    let clean: Bool
    let written: [Range<Int64>]
    let writtenPages: PageSet?

    func contains(_ page: Int) -> Bool { pages.contains(page) }

    func writtenRanges(pageSize: Int) -> [Range<Int64>] {
        guard let writtenPages else { return written }
        return FileContents.byteRanges(writtenPages.runs(), pageSize: pageSize)
    }
}

/// The bytes of one ``SpillLayer``: in memory or in a spill file. Requests read and write them
/// without the view lock; which of them count is the layer's to say.
final class SpillBytes: Sendable {
    /// Guarded by its own lock, which only this file's requests take, and held for memory copies
    /// only: a spill file's I/O runs outside it (its descriptor never changes once set), except
    /// the one move of a memory layer into a new file.
    private let storage = Mutex(Storage.empty)
    private let files: SpillFiles

    private enum Storage {
        /// Nothing written yet.
        case empty
        /// The bytes from offset 0, a multiple of 4 KiB long, with its budget taken; bytes past
        /// the end read as zeros.
        case memory([UInt8])
        case file(Int32)
    }

    init(files: SpillFiles) { self.files = files }

    /// Counts a page copied into this layer from a lower one.
    func countCopy() { files.countCopy() }

    deinit {
        switch storage.withLock({ $0 }) {
        case .empty: break
        case .memory(let bytes): files.release(bytes.count)
        case .file(let fd): files.give(fd)
        }
    }

    /// The spill file's descriptor, once the layer has one: it never changes after.
    var descriptor: Int32? {
        storage.withLock { storage in
            if case .file(let fd) = storage { return fd }
            return nil
        }
    }

    /// Writes `bytes` at file offset `offset`.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(Errno) {
        guard let address = bytes.baseAddress else { return }
        let fd = try storage.withLock { storage throws(Errno) -> Int32? in
            if case .file(let fd) = storage { return fd }
            var held: [UInt8] = []
            if case .memory(let bytes) = storage { held = bytes }
            // The buffer's only reference while it changes, so it is not copied.
            storage = .empty
            let end = offset + Int64(bytes.count)
            if end <= Int64(SpillFiles.memoryLayerLimit) {
                let size = Int((end + 4095) / 4096 * 4096)
                if size <= held.count || files.reserve(size - held.count) {
                    if size > held.count {
                        held.append(contentsOf: repeatElement(0, count: size - held.count))
                    }
                    held.withUnsafeMutableBytes { raw in
                        if let base = raw.baseAddress {
                            (base + Int(offset)).copyMemory(from: address, byteCount: bytes.count)
                        }
                    }
                    storage = .memory(held)
                    return nil
                }
            }
            // Too far into the file, or the budget is spent: into a spill file, for good.
            let fd: Int32
            do throws(Errno) {
                fd = try files.take()
            } catch {
                storage = held.isEmpty ? .empty : .memory(held)
                throw error
            }
            let moved = held.withUnsafeBytes { raw in
                Result { () throws(Errno) in try Self.write(fd, raw, at: 0) }
            }
            if case .failure(let error) = moved {
                files.give(fd)
                storage = held.isEmpty ? .empty : .memory(held)
                throw error
            }
            files.release(held.count)
            storage = .file(fd)
            return fd
        }
        if let fd {
            try Self.write(fd, UnsafeRawBufferPointer(start: address, count: bytes.count), at: offset)
        }
    }

    private static func write(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(Errno) {
        guard let address = bytes.baseAddress else { return }
        var done = 0
        while done < bytes.count {
            let n = pwrite(fd, address + done, bytes.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            done += n
        }
    }

    /// Reads `count` bytes at `offset` into `buffer` (zeros where nothing was written).
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws(Errno) {
        guard let address = buffer.baseAddress else { return }
        let fd = storage.withLock { storage -> Int32? in
            switch storage {
            case .file(let fd):
                return fd
            case .empty:
                memset(address, 0, buffer.count)
            case .memory(let bytes):
                let available = max(0, min(buffer.count, bytes.count - Int(clamping: offset)))
                if available > 0 {
                    bytes.withUnsafeBytes { raw in
                        if let base = raw.baseAddress {
                            address.copyMemory(from: base + Int(offset), byteCount: available)
                        }
                    }
                }
                memset(address + available, 0, buffer.count - available)
            }
            return nil
        }
        guard let fd else { return }
        try Self.read(fd, into: buffer, at: offset)
    }

    /// Reads `buffer.count` bytes of the spill file `fd` at `offset`, zeros past its end.
    static func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws(Errno)
    {
        guard let address = buffer.baseAddress else { return }
        var done = 0
        while done < buffer.count {
            let n = pread(fd, address + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            if n == 0 {
                memset(address + done, 0, buffer.count - done)
                return
            }
            done += n
        }
    }

    /// Makes `[offset, offset+length)` read as zeros.
    func zero(at offset: Int64, length: Int64) throws(Errno) {
        guard length > 0 else { return }
        let fd = storage.withLock { storage -> Int32? in
            switch storage {
            case .file(let fd):
                return fd
            case .empty:
                return nil  // never written: it reads as zeros already
            case .memory(var bytes):
                storage = .empty
                let from = Int(clamping: min(offset, Int64(bytes.count)))
                let to = Int(clamping: min(offset + length, Int64(bytes.count)))
                if from < to {
                    bytes.withUnsafeMutableBytes { raw in
                        if let base = raw.baseAddress { memset(base + from, 0, to - from) }
                    }
                }
                storage = .memory(bytes)
                return nil
            }
        }
        guard let fd else { return }
        if docfs_punch_hole(fd, off_t(offset), off_t(length)) == 0 { return }
        // No hole punching on this file system: write the zeros.
        let zeros = [UInt8](repeating: 0, count: Int(min(length, 1 << 20)))
        var at = offset
        while at < offset + length {
            let n = Int(min(Int64(zeros.count), offset + length - at))
            try withRawBytes(zeros) { raw throws(Errno) in
                try Self.write(fd, UnsafeRawBufferPointer(rebasing: raw[0..<n]), at: at)
            }
            at += Int64(n)
        }
    }
}
