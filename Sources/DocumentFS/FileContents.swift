import CLinuxSupport
import DocumentEngine
import Foundation
import SystemPackage

#if canImport(Glibc)
    import Glibc
#endif

/// Where a file's clean bytes come from: a wrapper's contents in the store at one version.
struct ContentBase: Sendable, Equatable {
    var node: StoreNodeID
    var version: VersionID?
    /// Bytes at or past this read as zeros.
    var size: Int64
    /// With `archives=xml`, a stored binary property list read as its XML text: the bytes come
    /// from ``PropertyListText/text`` (and ``size`` is its length), not from the store.
    var text: PropertyListText? = nil
    /// Bytes the mount makes up (a Trash item's `.trashinfo`), read instead of the store's.
    var bytes: Data? = nil

    /// A file with no stored bytes (a new file).
    static func empty(_ node: StoreNodeID) -> ContentBase { ContentBase(node: node, version: nil, size: 0) }

    static func == (a: ContentBase, b: ContentBase) -> Bool {
        a.node == b.node && a.version == b.version && a.size == b.size && a.text === b.text
            && a.bytes == b.bytes
    }
}

/// Written chunks of one file, kept in an unnamed local file (the spill) rather than in memory,
/// so a large write costs disk, not RAM.
///
/// Invariant: every byte of the spill outside ``chunks`` reads as zero (dropped chunks are
/// punched out), so a chunk can be taken into the layer by writing only what it must keep.
final class SpillLayer: @unchecked Sendable {
    // Mutated only under the file system's lock while the layer is active; read-only once a save
    // has frozen it, so a save may read it without the lock.
    private(set) var chunks: Set<Int> = []
    /// Bytes at or past `cut` in the layers below (and the base) read as zeros: the smallest size
    /// the file was truncated to while this layer was on top.
    var cut: Int64 = .max
    private var fd: Int32 = -1
    private let directory: String

    init(directory: String) { self.directory = directory }

    deinit { if fd >= 0 { Glibc.close(fd) } }

    var isEmpty: Bool { chunks.isEmpty && cut == .max }

    private func descriptor() throws(Errno) -> Int32 {
        if fd >= 0 { return fd }
        var opened = docfs_open_tmpfile(directory)
        if opened < 0 {
            // No O_TMPFILE here (some file systems): a named file, unlinked at once.
            var template = Array("\(directory)/.docfs-spill-XXXXXX".utf8CString)
            opened = mkstemp(&template)
            if opened >= 0 { template.withUnsafeBufferPointer { _ = unlink($0.baseAddress!) } }
        }
        guard opened >= 0 else { throw Errno(rawValue: errno) }
        fd = opened
        return fd
    }

    func contains(_ chunk: Int) -> Bool { chunks.contains(chunk) }

    /// Writes `bytes` at file offset `offset` (inside chunks that are or become part of this layer).
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(Errno) {
        let fd = try descriptor()
        var done = 0
        while done < bytes.count {
            let n = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            done += n
        }
    }

    func add(_ chunk: Int) { chunks.insert(chunk) }

    /// Reads `count` bytes at `offset` into `buffer` (zeros where nothing was written).
    func read(into buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws(Errno) {
        guard fd >= 0 else {
            memset(buffer.baseAddress!, 0, buffer.count)
            return
        }
        var done = 0
        while done < buffer.count {
            let n = pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            if n < 0 {
                if errno == EINTR { continue }
                throw Errno(rawValue: errno)
            }
            if n == 0 {
                memset(buffer.baseAddress! + done, 0, buffer.count - done)
                return
            }
            done += n
        }
    }

    /// Makes `[offset, offset+length)` read as zeros.
    func zero(at offset: Int64, length: Int64) throws(Errno) {
        guard fd >= 0, length > 0 else { return }
        if docfs_punch_hole(fd, off_t(offset), off_t(length)) == 0 { return }
        // No hole punching on this file system: write the zeros.
        let zeros = [UInt8](repeating: 0, count: Int(min(length, 1 << 20)))
        var at = offset
        while at < offset + length {
            let n = Int(min(Int64(zeros.count), offset + length - at))
            try withRawBytes(zeros) { raw throws(Errno) in
                try write(UnsafeRawBufferPointer(rebasing: raw[0..<n]), at: at)
            }
            at += Int64(n)
        }
    }

    /// Drops chunks at or past `index` (truncation).
    func drop(from index: Int, chunkSize: Int) throws(Errno) {
        for chunk in chunks where chunk >= index {
            try zero(at: Int64(chunk) * Int64(chunkSize), length: Int64(chunkSize))
            chunks.remove(chunk)
        }
    }
}

/// The contents of one regular file as the mount sees it: clean bytes from the store (the
/// base) under layers of written chunks.
///
/// Saving freezes the layers (``freeze()``) and starts a new top layer for writes that arrive
/// during the save; a successful save makes the frozen state the new base, a failed one keeps
/// the layers for the next try. All members are guarded by the file system's lock.
final class FileContents: @unchecked Sendable {
    var base: ContentBase
    /// Oldest first; the last one takes writes.
    private(set) var layers: [SpillLayer] = []
    /// How many of the first layers a running save has frozen.
    private(set) var frozen = 0
    var size: Int64
    /// Bumped when another process's save replaced the base: handles opened before then keep
    /// reading what they opened.
    var generation: UInt64 = 0
    /// Bumped by every write and truncation, so that a compiled text is known to be current.
    private(set) var edits: UInt64 = 0
    /// With `archives=xml`: the file is stored as a binary property list of this kind and shown
    /// as text, so what is written must compile back to one.
    var propertyList: PropertyListText.Kind?
    /// The text shown for the property list whose place this file took (a rename onto it, or a
    /// new file under the name it left): written back unchanged, it stores those bytes.
    var replaces: PropertyListText?
    /// The last compile of the written text (``edits`` at the time, and its outcome).
    var compiled: (edits: UInt64, outcome: Result<PropertyListText, PropertyListTextError>)?
    let chunkSize: Int
    let spillDirectory: String

    init(base: ContentBase, chunkSize: Int, spillDirectory: String) {
        self.base = base
        self.size = base.size
        self.chunkSize = chunkSize
        self.spillDirectory = spillDirectory
    }

    /// Whether anything was written or truncated since the base.
    var isModified: Bool { size != base.size || layers.contains { !$0.isEmpty } }

    private var top: SpillLayer {
        if layers.count > frozen, let last = layers.last { return last }
        let layer = SpillLayer(directory: spillDirectory)
        layers.append(layer)
        return layer
    }

    /// Where a chunk's bytes come from, looking through `layers[0..<limit]` then the base.
    enum Source {
        case layer(SpillLayer)
        /// The base, whose bytes past `size` are zeros.
        case base(ContentBase)
        case zero
    }

    func source(of chunk: Int) -> Source {
        Self.source(of: chunk, layers: layers[...], base: base, chunkSize: chunkSize)
    }

    /// The source of a chunk seen through `layers` (oldest first) over `base`.
    static func source(of chunk: Int, layers: ArraySlice<SpillLayer>, base: ContentBase, chunkSize: Int)
        -> Source
    {
        let start = Int64(chunk) * Int64(chunkSize)
        for layer in layers.reversed() {
            if layer.contains(chunk) { return .layer(layer) }
            if start >= layer.cut { return .zero }
        }
        return start < base.size ? .base(base) : .zero
    }

    /// A chunk's bytes (its full length, zeros past the file's end) that must come from the
    /// store before it can be taken into the top layer, or nil when no store read is needed.
    func storeReadNeeded(for chunk: Int) -> ContentBase? {
        if top.contains(chunk) { return nil }
        if case .base(let base) = source(of: chunk) { return base }
        return nil
    }

    /// Takes `chunk` into the top layer, copying what it holds now. `stored` is the chunk's
    /// bytes from the store when its source is the base.
    func takeIntoTop(_ chunk: Int, stored: Data?) throws(Errno) {
        let layer = top
        guard !layer.contains(chunk) else { return }
        let start = Int64(chunk) * Int64(chunkSize)
        switch source(of: chunk) {
        case .zero:
            break
        case .layer(let lower):
            var bytes = [UInt8](repeating: 0, count: chunkSize)
            try withMutableRawBytes(&bytes) { raw throws(Errno) in try lower.read(into: raw, at: start) }
            try withRawBytes(bytes) { raw throws(Errno) in try layer.write(raw, at: start) }
        case .base(let base):
            guard let stored else { throw .ioError }
            let keep = Int(max(0, min(Int64(stored.count), base.size - start)))
            if keep > 0 {
                try withRawBytes(Array(stored.prefix(keep))) { raw throws(Errno) in
                    try layer.write(raw, at: start)
                }
            }
        }
        layer.add(chunk)
    }

    /// Chunks a write of `count` bytes at `offset` must take in with their old bytes (those it
    /// covers only partly, below the current size).
    func partiallyCoveredChunks(offset: Int64, count: Int) -> [Int] {
        guard count > 0 else { return [] }
        let end = offset + Int64(count)
        let cs = Int64(chunkSize)
        var result: [Int] = []
        for chunk in Int(offset / cs)...Int((end - 1) / cs) {
            let chunkStart = Int64(chunk) * cs
            // Old bytes that matter: below the current size and outside the written range.
            let keepEnd = min(chunkStart + cs, size)
            let coversAll = offset <= chunkStart && end >= keepEnd
            if !coversAll && chunkStart < size { result.append(chunk) }
        }
        return result
    }

    /// Writes bytes; every partly covered chunk must already be in the top layer.
    func write(_ bytes: UnsafeRawBufferPointer, at offset: Int64) throws(Errno) {
        guard bytes.count > 0 else { return }
        let layer = top
        let cs = Int64(chunkSize)
        let end = offset + Int64(bytes.count)
        for chunk in Int(offset / cs)...Int((end - 1) / cs) where !layer.contains(chunk) {
            // Fully overwritten (or past the end): nothing old to keep, and the spill reads zeros.
            layer.add(chunk)
        }
        try layer.write(bytes, at: offset)
        size = max(size, end)
        edits &+= 1
    }

    /// The chunk a truncation to `newSize` cuts in the middle and that must be taken in first.
    func chunkCutBy(_ newSize: Int64) -> Int? {
        guard newSize < size, newSize % Int64(chunkSize) != 0 else { return nil }
        return Int(newSize / Int64(chunkSize))
    }

    /// Sets the size; the chunk ``chunkCutBy(_:)`` names must already be in the top layer.
    func truncate(to newSize: Int64) throws(Errno) {
        if newSize < size {
            let layer = top
            let cs = Int64(chunkSize)
            let firstGone = Int((newSize + cs - 1) / cs)
            try layer.drop(from: firstGone, chunkSize: chunkSize)
            if newSize % cs != 0 {
                let chunk = Int(newSize / cs)
                let chunkEnd = Int64(chunk + 1) * cs
                try layer.zero(at: newSize, length: chunkEnd - newSize)
            }
            layer.cut = min(layer.cut, newSize)
        }
        size = newSize
        edits &+= 1
    }

    /// Plans a read: spill and zero bytes are copied now (under the lock); store ranges are
    /// returned to be read without it.
    func read(offset: Int64, count: Int, into buffer: inout [UInt8]) throws(Errno) -> [StoreRead] {
        try Self.plan(offset: offset, count: count, size: size, chunkSize: chunkSize, into: &buffer) {
            source(of: $0)
        }
    }

    /// Copies the spill and zero parts of `[offset, offset+count)` (clipped to `size`) into
    /// `buffer`, and returns the parts that come from the store.
    static func plan(
        offset: Int64, count: Int, size: Int64, chunkSize: Int, into buffer: inout [UInt8],
        source: (Int) -> Source
    ) throws(Errno) -> [StoreRead] {
        var pending: [StoreRead] = []
        let end = min(offset + Int64(count), size)
        guard end > offset else {
            buffer = []
            return []
        }
        buffer = [UInt8](repeating: 0, count: Int(end - offset))
        let cs = Int64(chunkSize)
        var at = offset
        while at < end {
            let chunk = Int(at / cs)
            let pieceEnd = min(end, Int64(chunk + 1) * cs)
            let length = Int(pieceEnd - at)
            let destination = Int(at - offset)
            switch source(chunk) {
            case .zero:
                break
            case .layer(let layer):
                try withMutableRawBytes(&buffer) { raw throws(Errno) in
                    try layer.read(
                        into: UnsafeMutableRawBufferPointer(
                            rebasing: raw[destination..<destination + length]),
                        at: at)
                }
            case .base(let base):
                let stored = min(pieceEnd, base.size) - at
                if stored > 0 {
                    pending.append(
                        StoreRead(base: base, offset: at, count: Int(stored), destination: destination))
                }
            }
            at = pieceEnd
        }
        return pending
    }

    // MARK: Saving

    /// What a save of this file sends: the chunks to write and how to read them.
    struct Snapshot: @unchecked Sendable {
        let contents: FileContents
        let layers: [SpillLayer]
        let base: ContentBase
        let size: Int64
        let chunkSize: Int
        /// The contents' generation when frozen: a reset since (another file's bytes shared
        /// into it, another process's save) makes this save's outcome no longer the file's.
        let generation: UInt64

        /// Chunks written since the base, plus those a truncation zeroed below `storedSize` (the
        /// size the store has for the node).
        func changedChunks(storedSize: Int64) -> [Int] {
            var changed = Set<Int>()
            var lowest = base.size
            for layer in layers {
                changed.formUnion(layer.chunks)
                lowest = min(lowest, layer.cut)
            }
            let cs = Int64(chunkSize)
            let zeroedEnd = min(size, storedSize)
            if zeroedEnd > lowest {
                for chunk in Int((lowest + cs - 1) / cs)..<Int((zeroedEnd + cs - 1) / cs) {
                    changed.insert(chunk)
                }
            }
            return changed.filter { Int64($0) * cs < size }.sorted()
        }

        /// Reads the frozen state's written and zeroed bytes. Bytes of the base are the store's
        /// own, named by the save (``ContentUpdate/derived(from:size:chunks:source:)``), so a read
        /// that would need them is a bug: it fails rather than call the store during its save.
        func read(offset: Int64, count: Int) throws -> Data {
            var buffer: [UInt8] = []
            let pending = try FileContents.plan(
                offset: offset, count: count, size: size, chunkSize: chunkSize, into: &buffer
            ) { chunk in
                FileContents.source(of: chunk, layers: layers[...], base: base, chunkSize: chunkSize)
            }
            if let piece = pending.first {
                throw DocumentStoreError.io(
                    "a save asked for \(piece.count) stored bytes at \(piece.offset) of a file it holds only in part"
                )
            }
            return Data(buffer)
        }
    }

    /// Freezes the current layers for a save; later writes go to a new layer.
    func freeze() -> Snapshot {
        frozen = layers.count
        return Snapshot(
            contents: self, layers: layers, base: base, size: size, chunkSize: chunkSize,
            generation: generation)
    }

    /// The save of `snapshot` is in the store as `version` of `node`: the frozen layers go.
    /// `text`: the file was stored as this compiled property list, and keeps reading as its text.
    func saved(_ snapshot: Snapshot, as node: StoreNodeID, version: VersionID, text: PropertyListText? = nil)
    {
        // Replaced while the save ran (its layers and base are gone): what was saved is an older
        // state, and the file's node is marked changed, so the next save stores the new one.
        guard snapshot.generation == generation else { return }
        layers.removeFirst(min(frozen, layers.count))
        frozen = 0
        base = ContentBase(node: node, version: version, size: snapshot.size, text: text)
    }

    /// The save failed: the frozen layers stay, under whatever was written since.
    func saveFailed() { frozen = 0 }

    /// Another process's save replaced the file: start over from the store.
    func reset(to base: ContentBase) {
        layers = []
        frozen = 0
        self.base = base
        size = base.size
        generation &+= 1
        edits &+= 1
    }
}

/// A range of a read that comes from the store.
struct StoreRead: Sendable {
    var base: ContentBase
    var offset: Int64
    var count: Int
    /// Where it goes in the read's buffer.
    var destination: Int
}

/// Reads a frozen file's written chunks for the store's streaming save.
struct SnapshotSource: ContentsSource {
    let snapshot: FileContents.Snapshot
    var count: Int64 { snapshot.size }
    func read(offset: Int64, count: Int) throws -> Data {
        try snapshot.read(offset: offset, count: count)
    }
}

/// `Array.withUnsafeBytes` for bodies with typed throws.
func withRawBytes<T>(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(Errno) -> T) throws(Errno) -> T
{
    let result = bytes.withUnsafeBytes { raw in Result { () throws(Errno) -> T in try body(raw) } }
    return try result.get()
}

/// `Array.withUnsafeMutableBytes` for bodies with typed throws.
func withMutableRawBytes<T>(
    _ bytes: inout [UInt8], _ body: (UnsafeMutableRawBufferPointer) throws(Errno) -> T
)
    throws(Errno) -> T
{
    let result = bytes.withUnsafeMutableBytes { raw in Result { () throws(Errno) -> T in try body(raw) } }
    return try result.get()
}
