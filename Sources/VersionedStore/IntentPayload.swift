import CLinuxSupport
import DocumentEngine
import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

// MARK: - Payloads

/// One logged ``DocumentChanges``: its description, then the bytes of its contents, which are
/// read from their sources while the record is written (never all in memory at once).
package struct IntentPayload {
    var description: Data
    /// The ranges of each content source to copy after the description, in order.
    var pieces: [(source: any ContentsSource, ranges: [Range<Int64>])]
    var byteCount: Int64
    /// The bytes a save of the changes would write now.
    var saveCost: Int64

    var length: Int { description.count + Int(byteCount) }

    /// Describes `changes`; nil when a content update cannot be logged.
    init(_ changes: DocumentChanges, chunkSize: Int) throws {
        var writer = ByteWriter()
        writer.i64(changes.document.rawValue)
        writer.i64(changes.base.rawValue)
        writer.string(changes.origin)
        writer.u8(
            {
                switch changes.conflictPolicy {
                case .keepBoth: 0
                case .rebaseIfDisjoint: 1
                case .fail: 2
                }
            }())
        writer.u32(UInt32(changes.nodes.count))
        for node in changes.nodes { writer.node(node) }
        writer.u32(UInt32(changes.removedNodes.count))
        for id in changes.removedNodes { writer.i64(id.rawValue) }
        var pieces: [(source: any ContentsSource, ranges: [Range<Int64>])] = []
        var byteCount: Int64 = 0
        var saveCost: Int64 = 0
        let contents = changes.contents.sorted { $0.key < $1.key }
        writer.u32(UInt32(contents.count))
        func held(size: Int64, chunks: [Int], source: any ContentsSource) -> [Range<Int64>] {
            let listed = chunks.sorted().compactMap { index -> Range<Int64>? in
                let start = Int64(index) * Int64(chunkSize)
                guard index >= 0, start < size else { return nil }
                return start..<min(size, start + Int64(chunkSize))
            }
            saveCost += listed.reduce(0) { $0 + Int64($1.count) }
            // Only the bytes that differ from the file the update starts from (outside its
            // changed ranges the source reads as that file does; what it holds there is the
            // mount's cache of it), else what the source holds, else every listed byte. A
            // replay reads the rest from the stored file at the record's base, as the save would.
            guard let ranges = source.changedRanges ?? source.heldRanges else { return listed }
            var joined: [Range<Int64>] = []
            for range in ranges.sorted(by: { $0.lowerBound < $1.lowerBound }) {
                let clamped = range.clamped(to: 0..<size)
                guard !clamped.isEmpty else { continue }
                if let last = joined.last, clamped.lowerBound <= last.upperBound {
                    joined[joined.count - 1] = last.lowerBound..<max(last.upperBound, clamped.upperBound)
                } else {
                    joined.append(clamped)
                }
            }
            return joined
        }
        // A sparse or derived update: its size, chunks and ranges, then the held bytes.
        func partial(size: Int64, chunks: [Int], source: any ContentsSource) {
            writer.i64(size)
            writer.indices(chunks)
            writer.ranges(source.changedRanges)
            let ranges = held(size: size, chunks: chunks, source: source)
            writer.ranges(ranges)
            pieces.append((source, ranges))
            byteCount += ranges.reduce(0) { $0 + Int64($1.count) }
        }
        for (id, update) in contents {
            writer.i64(id.rawValue)
            switch update {
            case .chunks(let size, let chunks):
                writer.u8(0)
                writer.i64(size)
                let sorted = chunks.sorted { $0.key < $1.key }
                writer.u32(UInt32(sorted.count))
                for (index, data) in sorted {
                    writer.i64(Int64(index))
                    writer.data(data)
                    saveCost += Int64(data.count)
                }
            case .sparse(let size, let chunks, let source):
                writer.u8(1)
                partial(size: size, chunks: chunks, source: source)
            case .derived(let from, let size, let chunks, let source):
                writer.u8(2)
                writer.lookup(from)
                partial(size: size, chunks: chunks, source: source)
            case .copy(let from):
                writer.u8(3)
                writer.lookup(from)
            case .replace(let source):
                writer.u8(4)
                writer.i64(source.count)
                pieces.append((source, source.count > 0 ? [0..<source.count] : []))
                byteCount += source.count
                saveCost += source.count
            }
        }
        description = Data()
        description.append(littleEndian: UInt32(writer.bytes.count))
        description.append(writer.bytes)
        self.pieces = pieces
        self.byteCount = byteCount
        self.saveCost = saveCost
    }

    /// Writes the payload at `offset`; returns its CRC-32C.
    func write(_ fd: Int32, at offset: Int64, path: String) throws -> UInt32 {
        var crc = description.withUnsafeBytes { docfs_crc32c(0, $0.baseAddress, $0.count) }
        try description.withUnsafeBytes { try IntentLog.writeAll(fd, $0, at: offset, path: path) }
        var position = offset + Int64(description.count)
        let piece = 1 << 20
        for (source, ranges) in pieces {
            for range in ranges {
                var start = range.lowerBound
                while start < range.upperBound {
                    let count = Int(min(Int64(piece), range.upperBound - start))
                    var data = try source.read(offset: start, count: count)
                    // A short read (past the source's end) is zeros, as the store would read it.
                    if data.count < count { data.append(Data(count: count - data.count)) }
                    crc = data.withUnsafeBytes { docfs_crc32c(crc, $0.baseAddress, $0.count) }
                    try data.withUnsafeBytes { try IntentLog.writeAll(fd, $0, at: position, path: path) }
                    position += Int64(count)
                    start += Int64(count)
                }
            }
        }
        return crc
    }

    /// The changes a record's payload describes, their bytes read from the payload.
    static func changes(from payload: Data) throws -> DocumentChanges {
        var outer = ByteReader(payload)
        guard let length = outer.u32(), Int(length) <= payload.count - 4 else { throw malformed }
        let bytesStart = 4 + Int(length)
        var reader = ByteReader(payload.subdata(in: 4..<bytesStart))
        var position = bytesStart
        func take(_ ranges: [Range<Int64>]) throws -> LoggedSource.Pieces {
            var pieces: LoggedSource.Pieces = []
            for range in ranges {
                let count = Int(range.count)
                guard position + count <= payload.count else { throw malformed }
                pieces.append((range, payload.subdata(in: position..<position + count)))
                position += count
            }
            return pieces
        }
        guard let document = reader.i64(), let base = reader.i64(), let origin = reader.string(),
            let policy = reader.u8()
        else { throw malformed }
        var changes = DocumentChanges(
            document: DocumentID(rawValue: document), base: VersionID(rawValue: base))
        changes.origin = origin
        switch policy {
        case 0: changes.conflictPolicy = .keepBoth
        case 1: changes.conflictPolicy = .rebaseIfDisjoint
        case 2: changes.conflictPolicy = .fail
        default: throw malformed
        }
        guard let nodeCount = reader.u32() else { throw malformed }
        for _ in 0..<nodeCount {
            guard let node = reader.node() else { throw malformed }
            changes.nodes.append(node)
        }
        guard let removedCount = reader.u32() else { throw malformed }
        for _ in 0..<removedCount {
            guard let id = reader.i64() else { throw malformed }
            changes.removedNodes.append(StoreNodeID(rawValue: id))
        }
        guard let contentCount = reader.u32() else { throw malformed }
        for _ in 0..<contentCount {
            guard let rawID = reader.i64(), let kind = reader.u8() else { throw malformed }
            let id = StoreNodeID(rawValue: rawID)
            switch kind {
            case 0:
                guard let size = reader.i64(), let count = reader.u32() else { throw malformed }
                var chunks: [Int: Data] = [:]
                for _ in 0..<count {
                    guard let index = reader.i64(), let data = reader.data() else { throw malformed }
                    chunks[Int(index)] = data
                }
                changes.contents[id] = .chunks(size: size, chunks)
            case 1, 2:
                var from: NodeLookup?
                if kind == 2 {
                    guard let lookup = reader.lookup() else { throw malformed }
                    from = lookup
                }
                guard let size = reader.i64(), let chunks = reader.indices(),
                    let changed = reader.optionalRanges(),
                    let held = reader.ranges()
                else { throw malformed }
                let source = LoggedSource(count: size, pieces: try take(held), changedRanges: changed)
                if let from {
                    changes.contents[id] = .derived(from: from, size: size, chunks: chunks, source: source)
                } else {
                    changes.contents[id] = .sparse(size: size, chunks: chunks, source: source)
                }
            case 3:
                guard let from = reader.lookup() else { throw malformed }
                changes.contents[id] = .copy(of: from)
            case 4:
                guard let size = reader.i64(), size >= 0 else { throw malformed }
                let pieces = try take(size > 0 ? [0..<size] : [])
                changes.contents[id] = .replace(LoggedSource(count: size, pieces: pieces, changedRanges: nil))
            default:
                throw malformed
            }
        }
        return changes
    }

    static var malformed: DocumentStoreError { .invalidChange("a malformed intent log record") }
}

/// Logged bytes of a file, read back for a replay: the ranges it holds, zeros elsewhere.
struct LoggedSource: ContentsSource {
    typealias Pieces = [(range: Range<Int64>, data: Data)]
    let count: Int64
    let pieces: Pieces
    let changedRanges: [Range<Int64>]?
    var heldRanges: [Range<Int64>]? { pieces.map(\.range) }
    var isStable: Bool { true }

    func read(offset: Int64, count wanted: Int) throws -> Data {
        let end = min(count, offset + Int64(wanted))
        guard offset < end else { return Data() }
        var result = Data(count: Int(end - offset))
        for piece in pieces where piece.range.overlaps(offset..<end) {
            let from = max(offset, piece.range.lowerBound)
            let to = min(end, piece.range.upperBound)
            let source = Int(from - piece.range.lowerBound)..<Int(to - piece.range.lowerBound)
            result.replaceSubrange(
                Int(from - offset)..<Int(to - offset),
                with: piece.data[
                    piece.data.startIndex + source.lowerBound..<piece.data.startIndex + source.upperBound])
        }
        return result
    }

}

// MARK: - Bytes

package struct ByteWriter {
    var bytes = Data()
    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func u32(_ value: UInt32) { bytes.append(littleEndian: value) }
    mutating func u64(_ value: UInt64) { bytes.append(littleEndian: value) }
    mutating func i64(_ value: Int64) { bytes.append(littleEndian: UInt64(bitPattern: value)) }
    mutating func data(_ value: Data) {
        u64(UInt64(value.count))
        bytes.append(value)
    }
    mutating func string(_ value: String) { data(Data(value.utf8)) }
    mutating func optional<T>(_ value: T?, _ body: (inout Self, T) -> Void) {
        if let value {
            u8(1)
            body(&self, value)
        } else {
            u8(0)
        }
    }
    mutating func indices(_ values: [Int]) {
        u32(UInt32(values.count))
        for value in values { i64(Int64(value)) }
    }
    mutating func ranges(_ values: [Range<Int64>]?) {
        optional(values) { writer, values in
            writer.u32(UInt32(values.count))
            for range in values {
                writer.i64(range.lowerBound)
                writer.i64(range.upperBound)
            }
        }
    }
    mutating func ranges(_ values: [Range<Int64>]) { ranges(Optional(values)) }
    mutating func lookup(_ lookup: NodeLookup) {
        i64(lookup.node.rawValue)
        optional(lookup.version) { $0.i64($1.rawValue) }
    }
    mutating func node(_ node: NodeRecord) {
        i64(node.id.rawValue)
        i64(node.document.rawValue)
        optional(node.parent) { $0.i64($1.rawValue) }
        string(node.name)
        optional(node.preferredName) { $0.string($1) }
        u8(
            {
                switch node.kind {
                case .regularFile: 0
                case .directory: 1
                case .symbolicLink: 2
                case .fifo: 3
                case .socket: 4
                case .characterDevice: 5
                case .blockDevice: 6
                }
            }())
        i64(Int64(node.permissions))
        u32(node.uid)
        u32(node.gid)
        i64(node.modified.rawValue)
        i64(node.changed.rawValue)
        i64(node.accessed.rawValue)
        i64(node.created.rawValue)
        i64(node.size)
        optional(node.linkTarget) { $0.string($1) }
        u64(node.device)
        let attributes = node.extendedAttributes.sorted { $0.key < $1.key }
        u32(UInt32(attributes.count))
        for (key, value) in attributes {
            string(key)
            data(value)
        }
        optional(node.linkOf) { $0.i64($1.rawValue) }
        i64(node.version.rawValue)
    }
}

package struct ByteReader {
    private let bytes: Data
    private var position: Int

    init(_ bytes: Data) {
        self.bytes = bytes
        position = bytes.startIndex
    }

    private mutating func take(_ count: Int) -> Data? {
        guard count >= 0, bytes.endIndex - position >= count else { return nil }
        defer { position += count }
        return bytes[position..<position + count]
    }
    private mutating func integer<T: FixedWidthInteger>(_: T.Type) -> T? {
        guard let raw = take(MemoryLayout<T>.size) else { return nil }
        var value = T.zero
        for (index, byte) in raw.enumerated() { value |= T(byte) << (8 * index) }
        return value
    }
    mutating func u8() -> UInt8? { take(1)?.first }
    mutating func u32() -> UInt32? { integer(UInt32.self) }
    mutating func u64() -> UInt64? { integer(UInt64.self) }
    mutating func i64() -> Int64? { u64().map { Int64(bitPattern: $0) } }
    mutating func data() -> Data? {
        guard let count = u64(), count <= UInt64(Int.max) else { return nil }
        return take(Int(count)).map { Data($0) }
    }
    mutating func string() -> String? { data().flatMap { String(data: $0, encoding: .utf8) } }
    mutating func optional<T>(_ body: (inout Self) -> T?) -> T?? {
        switch u8() {
        case 0: return .some(nil)
        case 1: return body(&self).map { .some($0) }
        default: return nil
        }
    }
    mutating func indices() -> [Int]? {
        guard let count = u32() else { return nil }
        var values: [Int] = []
        for _ in 0..<count {
            guard let value = i64() else { return nil }
            values.append(Int(value))
        }
        return values
    }
    mutating func optionalRanges() -> [Range<Int64>]?? {
        optional { reader -> [Range<Int64>]? in
            guard let count = reader.u32() else { return nil }
            var values: [Range<Int64>] = []
            for _ in 0..<count {
                guard let start = reader.i64(), let end = reader.i64(), start <= end else { return nil }
                values.append(start..<end)
            }
            return values
        }
    }
    mutating func ranges() -> [Range<Int64>]? { optionalRanges().flatMap { $0 } }
    mutating func lookup() -> NodeLookup? {
        guard let node = i64(), let version = optional({ $0.i64() }) else { return nil }
        return NodeLookup(StoreNodeID(rawValue: node), at: version.map { VersionID(rawValue: $0) })
    }
    mutating func node() -> NodeRecord? {
        guard let id = i64(), let document = i64(), let parent = optional({ $0.i64() }), let name = string(),
            let preferredName = optional({ $0.string() }), let rawKind = u8(), let permissions = i64(),
            let uid = u32(), let gid = u32(), let modified = i64(), let changed = i64(),
            let accessed = i64(), let created = i64(), let size = i64(),
            let linkTarget = optional({ $0.string() }), let device = u64(), let attributeCount = u32()
        else { return nil }
        let kinds: [FileWrapper.Kind] = [
            .regularFile, .directory, .symbolicLink, .fifo, .socket, .characterDevice, .blockDevice,
        ]
        guard Int(rawKind) < kinds.count else { return nil }
        var attributes: [String: Data] = [:]
        for _ in 0..<attributeCount {
            guard let key = string(), let value = data() else { return nil }
            attributes[key] = value
        }
        guard let linkOf = optional({ $0.i64() }), let version = i64() else { return nil }
        return NodeRecord(
            id: StoreNodeID(rawValue: id), document: DocumentID(rawValue: document),
            parent: parent.map { StoreNodeID(rawValue: $0) }, name: name, preferredName: preferredName,
            kind: kinds[Int(rawKind)], permissions: Int(permissions), uid: uid, gid: gid,
            modified: Timestamp(rawValue: modified), changed: Timestamp(rawValue: changed),
            accessed: Timestamp(rawValue: accessed), created: Timestamp(rawValue: created), size: size,
            linkTarget: linkTarget, device: device, extendedAttributes: attributes,
            linkOf: linkOf.map { StoreNodeID(rawValue: $0) }, version: VersionID(rawValue: version))
    }
}

extension Data {
    mutating func append<T: FixedWidthInteger>(littleEndian value: T) {
        Swift.withUnsafeBytes(of: value.littleEndian) { append(contentsOf: $0) }
    }
}
