import Foundation

// MARK: - Binary writer

/// Encodes "bplist00" laid out as CF lays it out: objects in `_flattenPlist` order, equal leaves
/// shared as `BinaryUniquing` says, then the offset table and the trailer.
struct BinaryWriter {
    enum Object {
        /// Encoded bytes in `leafStore[start..<end]`.
        case leaf(Int, Int)
        case array([Int])
        case dictionary([Int], [Int])
    }

    enum LeafKey: Hashable {
        case string(ExactString)
        case integer(Int128)
        case real(UInt64)
        case date(UInt64)
        case data(Data)
        case uid(UInt64)
    }

    let uniquing: PropertyList.BinaryUniquing
    var objects: [Object] = []
    var leafStore: [UInt8] = []
    var unique: [LeafKey: Int] = [:]
    var firstBool: [Bool: Int] = [:]
    var firstUID: [UInt64: Int] = [:]

    init(uniquing: PropertyList.BinaryUniquing) { self.uniquing = uniquing }

    static let canonicalNaN = Double(bitPattern: 0x7FF8_0000_0000_0000)

    /// CF's _byteCount: the smallest of 1, 2, 4, 8 bytes that holds `v`.
    static func byteCount(_ v: UInt64) -> Int {
        if v <= 0xFF { return 1 }
        if v <= 0xFFFF { return 2 }
        if v <= 0xFFFF_FFFF { return 4 }
        return 8
    }

    static func appendBE(_ v: UInt64, _ size: Int, to out: inout [UInt8]) {
        var shift = (size - 1) * 8
        while shift >= 0 {
            out.append(UInt8(truncatingIfNeeded: v >> UInt64(shift)))
            shift -= 8
        }
    }

    /// CF's _appendInt: non-negative in 1/2/4/8 bytes.
    static func appendUnsigned(_ v: UInt64, to out: inout [UInt8]) {
        let size = byteCount(v)
        out.append(0x10 | UInt8(size.trailingZeroBitCount))
        appendBE(v, size, to: &out)
    }

    static func appendMarker(_ high: UInt8, count: Int, to out: inout [UInt8]) {
        if count < 15 {
            out.append(high | UInt8(count))
        } else {
            out.append(high | 0x0F)
            appendUnsigned(UInt64(count), to: &out)
        }
    }

    static func leafBytes(_ v: PropertyListValue, canonicalNaN: Bool, into out: inout [UInt8]) {
        switch v {
        case .string(let s):
            if s.utf8.allSatisfy({ $0 < 0x80 }) {
                appendMarker(0x50, count: s.utf8.count, to: &out)
                out.append(contentsOf: s.utf8)
            } else {
                let units = Array(s.utf16)
                appendMarker(0x60, count: units.count, to: &out)
                out.reserveCapacity(out.count + units.count * 2)
                for u in units {
                    out.append(UInt8(u >> 8))
                    out.append(UInt8(u & 0xFF))
                }
            }
        case .integer(let i):
            if i >= 0 && i <= Int128(Int64.max) {
                appendUnsigned(UInt64(i), to: &out)
            } else if i < 0 && i >= Int128(Int64.min) {
                out.append(0x13)
                appendBE(UInt64(bitPattern: Int64(i)), 8, to: &out)
            } else {
                out.append(0x14)
                let bits = UInt128(bitPattern: i)
                appendBE(UInt64(truncatingIfNeeded: bits >> 64), 8, to: &out)
                appendBE(UInt64(truncatingIfNeeded: bits), 8, to: &out)
            }
        case .real(let d):
            out.append(0x23)
            appendBE((canonicalNaN && d.isNaN ? Self.canonicalNaN : d).bitPattern, 8, to: &out)
        case .bool(let b):
            out.append(b ? 0x09 : 0x08)
        case .date(let d):
            out.append(0x33)
            appendBE(d.bitPattern, 8, to: &out)
        case .data(let d):
            appendMarker(0x40, count: d.count, to: &out)
            out.append(contentsOf: d)
        case .uid(let u):
            let size = byteCount(u)
            out.append(0x80 | UInt8(size - 1))
            appendBE(u, size, to: &out)
        case .array, .dictionary:
            break
        }
    }

    /// Appends a leaf object and returns its reference.
    mutating func appendLeaf(_ v: PropertyListValue) -> Int {
        let start = leafStore.count
        Self.leafBytes(v, canonicalNaN: uniquing == .corelibs, into: &leafStore)
        objects.append(.leaf(start, leafStore.count))
        return objects.count - 1
    }

    /// The sharing key for a leaf, or nil when this occurrence must get its own object.
    func key(for v: PropertyListValue) -> LeafKey? {
        switch (uniquing, v) {
        case (.byValue, .string(let s)): return .string(ExactString(s))
        case (.byValue, .integer(let i)): return .integer(i)
        case (.byValue, .real(let d)): return .real(d.bitPattern)
        case (.byValue, .date(let d)): return .date(d.bitPattern)
        case (.byValue, .data(let d)): return .data(d)
        case (.byValue, .uid(let u)): return .uid(u)
        case (.corelibs, .integer(let i)): return (-1...12).contains(i) ? .integer(i) : nil
        case (.corelibs, .real(let d)):
            if d.isNaN { return .real(Self.canonicalNaN.bitPattern) }
            if d.bitPattern == 0 || d == 1 || d.isInfinite { return .real(d.bitPattern) }
            return nil
        default: return nil
        }
    }

    /// CF's _flattenPlist: the object, then (dictionary) all keys, then all values, or (array) the elements.
    mutating func flatten(_ v: PropertyListValue) -> Int {
        switch v {
        case .array(let items):
            let ref = objects.count
            objects.append(.array([]))
            var refs: [Int] = []
            refs.reserveCapacity(items.count)
            for item in items { refs.append(flatten(item)) }
            objects[ref] = .array(refs)
            return ref
        case .dictionary(let entries):
            let ref = objects.count
            objects.append(.array([]))
            var keyRefs: [Int] = []
            var valueRefs: [Int] = []
            keyRefs.reserveCapacity(entries.count)
            valueRefs.reserveCapacity(entries.count)
            for e in entries { keyRefs.append(flatten(.string(e.key))) }
            for e in entries { valueRefs.append(flatten(e.value)) }
            objects[ref] = .dictionary(keyRefs, valueRefs)
            return ref
        case .bool(let b):
            // CF never puts booleans in its uniquing set, so every occurrence is written,
            // but its identity-keyed table maps the singleton to the first copy.
            let ref = appendLeaf(v)
            if let first = firstBool[b] { return first }
            firstBool[b] = ref
            return ref
        case .uid(let u) where uniquing == .corelibs:
            let ref = appendLeaf(v)
            if let first = firstUID[u] { return first }
            firstUID[u] = ref
            return ref
        default:
            let k = key(for: v)
            if let k, let existing = unique[k] { return existing }
            let ref = appendLeaf(v)
            if let k { unique[k] = ref }
            return ref
        }
    }

    mutating func encode(_ value: PropertyListValue) -> Data {
        _ = flatten(value)
        let count = objects.count
        let refSize = Self.byteCount(UInt64(count))
        var out: [UInt8] = PropertyList.binaryMagic
        var offsets: [Int] = []
        offsets.reserveCapacity(count)
        for object in objects {
            offsets.append(out.count)
            switch object {
            case .leaf(let start, let end):
                out.append(contentsOf: leafStore[start..<end])
            case .array(let refs):
                Self.appendMarker(0xA0, count: refs.count, to: &out)
                for r in refs { Self.appendBE(UInt64(r), refSize, to: &out) }
            case .dictionary(let keys, let values):
                Self.appendMarker(0xD0, count: keys.count, to: &out)
                for r in keys { Self.appendBE(UInt64(r), refSize, to: &out) }
                for r in values { Self.appendBE(UInt64(r), refSize, to: &out) }
            }
        }
        objects = []
        leafStore = []
        let tableOffset = out.count
        let offsetSize = Self.byteCount(UInt64(tableOffset))
        for o in offsets { Self.appendBE(UInt64(o), offsetSize, to: &out) }
        out.append(contentsOf: [0, 0, 0, 0, 0, 0])  // 5 unused bytes, sort version 0
        out.append(UInt8(offsetSize))
        out.append(UInt8(refSize))
        Self.appendBE(UInt64(count), 8, to: &out)
        Self.appendBE(0, 8, to: &out)  // top object
        Self.appendBE(UInt64(tableOffset), 8, to: &out)
        return Data(out)
    }
}
