import DocumentEngine
import Foundation

/// The store's `user.` extended attributes as one blob: u32 count, then per attribute a u16 name
/// length, the name, a u32 value length and the value (little-endian). Decoding checks every
/// length, so a damaged row gives an error, not a crash.
public enum XattrCoding {
    public static func encode(_ xattrs: [String: Data]) -> Data {
        var out = Data()
        func append<T: FixedWidthInteger>(_ v: T) {
            withUnsafeBytes(of: v.littleEndian) { out.append(contentsOf: $0) }
        }
        append(UInt32(xattrs.count))
        for (name, value) in xattrs.sorted(by: { $0.key < $1.key }) {
            let bytes = Data(name.utf8)
            append(UInt16(truncatingIfNeeded: bytes.count))
            out.append(bytes)
            append(UInt32(truncatingIfNeeded: value.count))
            out.append(value)
        }
        return out
    }

    public static func decode(_ data: Data) throws -> [String: Data] {
        if data.isEmpty { return [:] }
        let bytes = [UInt8](data)
        var offset = 0
        func take(_ n: Int) throws -> ArraySlice<UInt8> {
            guard n >= 0, n <= bytes.count - offset else {
                throw DocumentStoreError.corrupt(
                    path: "", reason: "extended attributes are truncated at byte \(offset)")
            }
            defer { offset += n }
            return bytes[offset..<offset + n]
        }
        func integer<T: FixedWidthInteger>(_: T.Type) throws -> T {
            try take(MemoryLayout<T>.size).reversed().reduce(T(0)) { $0 << 8 | T($1) }
        }
        let count = try integer(UInt32.self)
        guard Int(count) <= bytes.count / 6 else {
            throw DocumentStoreError.corrupt(
                path: "", reason: "extended attribute count \(count) is too large")
        }
        var result: [String: Data] = [:]
        for _ in 0..<count {
            let nameLength = Int(try integer(UInt16.self))
            guard let name = String(validating: try take(nameLength), as: UTF8.self) else {
                throw DocumentStoreError.corrupt(path: "", reason: "an extended attribute name is not UTF-8")
            }
            let valueLength = Int(try integer(UInt32.self))
            result[name] = Data(try take(valueLength))
        }
        guard offset == bytes.count else {
            throw DocumentStoreError.corrupt(path: "", reason: "extended attributes have trailing bytes")
        }
        return result
    }
}

/// A least-recently-used cache of chunk bytes by chunk id (ids are never reused).
package struct ChunkCache {
    /// What a store keeps. The kernel's page cache already keeps what a mount read (keep_cache);
    /// this cache serves the rest of a chunk to the next read request and a few hot chunks, so it
    /// stays small: with 64 MiB, streaming one large file took a daemon past 100 MiB (bench B7),
    /// and with 32 MiB fio's random writes did (114 MiB: each write into a chunk not yet written
    /// takes the chunk in, and the cache filled with chunks no read came back for).
    package static let storeCapacity = 8 << 20

    let capacity: Int
    private var entries: [Int64: (data: Data, tick: UInt64)] = [:]
    private var bytes = 0
    private var tick: UInt64 = 0

    package init(capacity: Int) { self.capacity = capacity }

    package mutating func get(_ id: Int64) -> Data? {
        guard let entry = entries[id] else { return nil }
        tick += 1
        entries[id] = (entry.data, tick)
        return entry.data
    }

    package mutating func put(_ id: Int64, _ data: Data) {
        guard data.count <= capacity / 4 else { return }
        tick += 1
        if let old = entries.updateValue((data, tick), forKey: id) { bytes -= old.data.count }
        bytes += data.count
        if bytes > capacity {
            // Evict the oldest quarter at once so eviction is amortised.
            let victims = entries.sorted { $0.value.tick < $1.value.tick }.prefix(max(1, entries.count / 4))
            for (key, value) in victims {
                entries[key] = nil
                bytes -= value.data.count
            }
        }
    }

    package mutating func removeAll() {
        entries = [:]
        bytes = 0
    }
}

/// A file at a saved version.
struct PinnedKey: Hashable {
    var node: StoreNodeID
    var version: VersionID
}

/// What reads at a saved version learned of a file: its size, and its extents beginning in
/// `covered` (by start, ascending).
struct PinnedFile {
    var size: Int64
    var covered: Range<Int64>
    var extents: [(start: Int64, extent: Extent)]
    /// Where the last read of it ended (a read starting there is sequential).
    var lastEnd: Int64 = -1

    /// The extents overlapping `offset..<end`, or nil when one could begin outside `covered`.
    func extents(overlapping offset: Int64, _ end: Int64, longest: Int64) -> [(start: Int64, extent: Extent)]?
    {
        guard let indices = indices(overlapping: offset, end, longest: longest) else { return nil }
        return indices.map { extents[$0] }.filter { $0.start + $0.extent.length > offset }
    }

    /// The indices in ``extents`` of those that may overlap `offset..<end` (each ends after
    /// `offset` or is empty; none begins at or past `end`), or nil when one could begin outside
    /// `covered`. Without an array of its own: a random read's bookkeeping is on its latency.
    func indices(overlapping offset: Int64, _ end: Int64, longest: Int64) -> Range<Int>? {
        guard covered.lowerBound <= max(0, offset - longest + 1), covered.upperBound >= end else {
            return nil
        }
        var low = 0
        var high = extents.count
        while low < high {
            let middle = (low + high) / 2
            if extents[middle].start + extents[middle].extent.length <= offset {
                low = middle + 1
            } else {
                high = middle
            }
        }
        var index = low
        while index < extents.count, extents[index].start < end { index += 1 }
        return low..<index
    }
}

/// A file a save wrote: its extents at `to` are those at `from` with `rows` applied.
struct CarriedExtents {
    var node: StoreNodeID
    var from: VersionID
    var to: VersionID
    var size: Int64
    var rows: [(start: Int64, extent: Extent?)]
}

/// The files reads at saved versions learned, bounded: about 250,000 extents (some 60 GiB of
/// 256 KiB chunks), then it starts over.
struct PinnedFiles {
    static let maxFiles = 50_000
    static let maxEntries = 250_000

    private(set) var files: [PinnedKey: PinnedFile] = [:]
    private var entries = 0

    mutating func learn(_ key: PinnedKey, _ file: PinnedFile) {
        if files.count >= Self.maxFiles || entries + file.extents.count > Self.maxEntries { removeAll() }
        entries += file.extents.count - (files[key]?.extents.count ?? 0)
        files[key] = file
    }

    /// The file as it was before this read, which ends at `end`.
    mutating func reading(_ key: PinnedKey, until end: Int64) -> PinnedFile? {
        guard let file = files[key] else { return nil }
        files[key]?.lastEnd = end
        return file
    }

    /// A save committed: its file at the new version is the file at the save's base with the
    /// save's extent rows, known without the database if the whole file at the base is. A
    /// program that writes and syncs a file over and over (a database) reads each chunk it
    /// takes in at the version its last save made.
    mutating func carry(_ file: CarriedExtents) {
        guard let old = files[PinnedKey(node: file.node, version: file.from)], old.covered.lowerBound == 0,
            old.covered.upperBound >= old.size
        else { return }
        var map: [Int64: Extent] = [:]
        for item in old.extents { map[item.start] = item.extent }
        for row in file.rows { map[row.start] = row.extent }
        let extents = map.filter { $0.key < file.size }.sorted { $0.key < $1.key }.map {
            (start: $0.key, extent: $0.value)
        }
        learn(
            PinnedKey(node: file.node, version: file.to),
            PinnedFile(size: file.size, covered: 0..<file.size, extents: extents))
    }

    mutating func forget(_ versions: Set<VersionID>) {
        for key in files.keys where versions.contains(key.version) {
            entries -= files.removeValue(forKey: key)?.extents.count ?? 0
        }
    }

    mutating func removeAll() {
        files.removeAll()
        entries = 0
    }
}
