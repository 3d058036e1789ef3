import Foundation

// MARK: - Binary reader

/// An offset or a marker as "0x…", for error messages.
@inline(__always) private func hex(_ v: Int) -> String { "0x" + String(v, radix: 16) }

/// Decodes "bplist00". The trailer is checked first; then the object graph is walked with an
/// explicit stack, a container that several references share is decoded once, and every
/// reference counts against the limits, so shared objects cannot expand into a huge value.
struct BinaryReader {
    let b: [UInt8]
    let limits: PropertyList.Limits
    var offsetIntSize = 0
    var refSize = 0
    var objectCount = 0
    var topObject = 0
    /// Start of the offset table = end of the object area.
    var tableOffset = 0

    init(bytes: [UInt8], limits: PropertyList.Limits) {
        b = bytes
        self.limits = limits
    }

    static func fail(_ s: String) -> PropertyListError { PropertyListError("binary: " + s) }

    @inline(__always) func be(_ at: Int, _ size: Int) -> UInt64 {
        var v: UInt64 = 0
        for i in at..<(at + size) { v = (v << 8) | UInt64(b[i]) }
        return v
    }

    mutating func readTrailer() throws(PropertyListError) {
        let n = b.count
        guard n >= 8, b[0..<8].elementsEqual(PropertyList.binaryMagic) else {
            if n >= 8, b[0..<6].elementsEqual(Array("bplist".utf8)) {
                let version = String(decoding: b[6..<8], as: UTF8.self)
                throw Self.fail("unsupported format version \"bplist\(version)\" (only bplist00 is read)")
            }
            throw Self.fail("missing \"bplist00\" header")
        }
        guard n >= 8 + 1 + 32 else {
            throw Self.fail("file is \(n) bytes, too short for a header, an object and a 32-byte trailer")
        }
        let t = n - 32
        offsetIntSize = Int(b[t + 6])
        refSize = Int(b[t + 7])
        let count = be(t + 8, 8)
        let top = be(t + 16, 8)
        let table = be(t + 24, 8)
        guard (1...8).contains(offsetIntSize) else {
            throw Self.fail("trailer offset size \(offsetIntSize) is not 1 to 8")
        }
        guard (1...8).contains(refSize) else {
            throw Self.fail("trailer object reference size \(refSize) is not 1 to 8")
        }
        guard count >= 1 else { throw Self.fail("trailer says the file has no objects") }
        guard count <= UInt64(max(limits.maximumObjectCount, 0)) else {
            throw Self.fail(
                "trailer claims \(count) objects, more than the limit of \(limits.maximumObjectCount)")
        }
        guard count < UInt64(Int32.max) else {
            throw Self.fail("trailer claims \(count) objects, more than this reader supports")
        }
        guard top < count else { throw Self.fail("top object \(top) is not below the object count \(count)") }
        guard table >= 9, table <= UInt64(t) else {
            throw Self.fail("offset table offset \(table) is outside the file (objects end before \(hex(t)))")
        }
        let (tableSize, o1) = count.multipliedReportingOverflow(by: UInt64(offsetIntSize))
        let (tableEnd, o2) = table.addingReportingOverflow(tableSize)
        guard !o1, !o2, tableEnd == UInt64(t) else {
            throw Self.fail(
                "offset table (\(count) entries of \(offsetIntSize) bytes at \(hex(Int(table)))) does not end at the trailer (\(hex(t)))"
            )
        }
        objectCount = Int(count)
        topObject = Int(top)
        tableOffset = Int(table)
    }

    /// Byte offset of object `index` (index < objectCount).
    func offset(of index: Int) throws(PropertyListError) -> Int {
        let raw = be(tableOffset + index * offsetIntSize, offsetIntSize)
        guard raw >= 8, raw < UInt64(tableOffset) else {
            if raw < 8 { throw Self.fail("object \(index) offset \(hex(Int(raw))) points into the header") }
            throw Self.fail(
                "object \(index) offset 0x\(String(raw, radix: 16)) past the end of the object area (\(hex(tableOffset)))"
            )
        }
        return Int(raw)
    }

    /// Reads the reference at byte `pos` (already bounds-checked) of container `owner`.
    func reference(at pos: Int, owner: Int) throws(PropertyListError) -> Int {
        let r = be(pos, refSize)
        guard r < UInt64(objectCount) else {
            throw Self.fail(
                "object \(owner) refers to object \(r), but there are only \(objectCount) objects")
        }
        return Int(r)
    }

    enum Object {
        case leaf(PropertyListValue, bytes: Int)
        case container(isDictionary: Bool, count: Int, refs: Int)
    }

    static func typeName(_ marker: UInt8) -> String {
        switch marker >> 4 {
        case 0x0: return marker == 0x08 || marker == 0x09 ? "boolean" : "marker \(hex(Int(marker)))"
        case 0x1: return "integer"
        case 0x2: return "real"
        case 0x3: return "date"
        case 0x4: return "data"
        case 0x5, 0x6: return "string"
        case 0x8: return "UID"
        case 0xA: return "array"
        case 0xC: return "set"
        case 0xD: return "dictionary"
        default: return "marker \(hex(Int(marker)))"
        }
    }

    /// Count of a sized object (low nibble, or 0xF then an integer object) and where its payload starts.
    func sizedHeader(_ index: Int, _ off: Int, _ marker: UInt8) throws(PropertyListError) -> (Int, Int) {
        let low = Int(marker & 0x0F)
        if low != 0x0F { return (low, off + 1) }
        guard off + 1 < tableOffset else {
            throw Self.fail("object \(index) at \(hex(off)): count runs past the end of the object area")
        }
        let im = b[off + 1]
        guard im >> 4 == 0x1, im & 0x0F <= 3 else {
            throw Self.fail(
                "object \(index) at \(hex(off)): count is not a 1, 2, 4 or 8-byte integer (marker \(hex(Int(im))))"
            )
        }
        let size = 1 << Int(im & 0x0F)
        guard size <= tableOffset - (off + 2) else {
            throw Self.fail("object \(index) at \(hex(off)): count runs past the end of the object area")
        }
        let v = be(off + 2, size)
        guard v <= UInt64(Int.max) else {
            throw Self.fail("object \(index) at \(hex(off)): count \(v) is too large")
        }
        return (Int(v), off + 2 + size)
    }

    func checkPayload(_ index: Int, _ off: Int, _ start: Int, count: Int, unit: Int, what: String)
        throws(PropertyListError) -> Int
    {
        let (length, overflow) = count.multipliedReportingOverflow(by: unit)
        guard !overflow, start <= tableOffset, length <= tableOffset - start else {
            throw Self.fail(
                "object \(index) (\(what) at \(hex(off))): \(count) elements run past the end of the object area (\(hex(tableOffset)))"
            )
        }
        return length
    }

    func object(_ index: Int) throws(PropertyListError) -> Object {
        let off = try offset(of: index)
        let marker = b[off]
        let low = Int(marker & 0x0F)
        switch marker >> 4 {
        case 0x0:
            switch marker {
            case 0x08: return .leaf(.bool(false), bytes: 0)
            case 0x09: return .leaf(.bool(true), bytes: 0)
            case 0x00:
                throw Self.fail(
                    "object \(index) at \(hex(off)): null (marker 0x00) is not allowed in bplist00")
            default: throw Self.fail("object \(index) at \(hex(off)): unknown marker \(hex(Int(marker)))")
            }
        case 0x1:
            guard low <= 4 else {
                throw Self.fail(
                    "object \(index) at \(hex(off)): integer of \(1 << min(low, 20)) bytes is not supported")
            }
            let size = 1 << low
            _ = try checkPayload(index, off, off + 1, count: size, unit: 1, what: "integer")
            let value: Int128
            switch size {
            case 1, 2, 4: value = Int128(be(off + 1, size))
            case 8: value = Int128(Int64(bitPattern: be(off + 1, 8)))
            default:
                let hi = Int64(bitPattern: be(off + 1, 8))
                let lo = be(off + 9, 8)
                value = (Int128(hi) << 64) | Int128(lo)
                guard value >= Int128(Int64.min), value <= Int128(UInt64.max) else {
                    throw Self.fail(
                        "object \(index) at \(hex(off)): integer \(value) out of range (Int64.min...UInt64.max)"
                    )
                }
            }
            return .leaf(.integer(value), bytes: 0)
        case 0x2:
            guard low == 2 || low == 3 else {
                throw Self.fail(
                    "object \(index) at \(hex(off)): real of \(1 << min(low, 20)) bytes is not supported (only 4 and 8)"
                )
            }
            let size = 1 << low
            _ = try checkPayload(index, off, off + 1, count: size, unit: 1, what: "real")
            let bits = be(off + 1, size)
            let d =
                size == 4
                ? Double(Float(bitPattern: UInt32(truncatingIfNeeded: bits))) : Double(bitPattern: bits)
            return .leaf(.real(d), bytes: 0)
        case 0x3:
            guard marker == 0x33 else {
                throw Self.fail(
                    "object \(index) at \(hex(off)): unknown marker \(hex(Int(marker))) (dates are 0x33)")
            }
            _ = try checkPayload(index, off, off + 1, count: 8, unit: 1, what: "date")
            return .leaf(.date(Double(bitPattern: be(off + 1, 8))), bytes: 0)
        case 0x4:
            let (count, start) = try sizedHeader(index, off, marker)
            let length = try checkPayload(index, off, start, count: count, unit: 1, what: "data")
            return .leaf(.data(Data(b[start..<(start + length)])), bytes: length)
        case 0x5:
            let (count, start) = try sizedHeader(index, off, marker)
            let length = try checkPayload(index, off, start, count: count, unit: 1, what: "ASCII string")
            let slice = b[start..<(start + length)]
            if let bad = slice.firstIndex(where: { $0 >= 0x80 }) {
                throw Self.fail(
                    "object \(index) at \(hex(off)): ASCII string contains byte \(hex(Int(b[bad]))) at \(hex(bad))"
                )
            }
            return .leaf(.string(String(decoding: slice, as: UTF8.self)), bytes: length)
        case 0x6:
            let (count, start) = try sizedHeader(index, off, marker)
            let length = try checkPayload(index, off, start, count: count, unit: 2, what: "UTF-16 string")
            var units = [UInt16]()
            units.reserveCapacity(count)
            var i = start
            while i < start + length {
                units.append(UInt16(b[i]) << 8 | UInt16(b[i + 1]))
                i += 2
            }
            var k = 0
            while k < units.count {
                let u = units[k]
                if u >= 0xD800 && u <= 0xDBFF {
                    guard k + 1 < units.count, units[k + 1] >= 0xDC00, units[k + 1] <= 0xDFFF else {
                        throw Self.fail(
                            "object \(index) at \(hex(off)): UTF-16 string has an unpaired high surrogate \(hex(Int(u))) at unit \(k)"
                        )
                    }
                    k += 2
                } else if u >= 0xDC00 && u <= 0xDFFF {
                    throw Self.fail(
                        "object \(index) at \(hex(off)): UTF-16 string has an unpaired low surrogate \(hex(Int(u))) at unit \(k)"
                    )
                } else {
                    k += 1
                }
            }
            return .leaf(.string(String(decoding: units, as: UTF16.self)), bytes: length)
        case 0x8:
            let size = low + 1
            _ = try checkPayload(index, off, off + 1, count: size, unit: 1, what: "UID")
            if size > 8, b[(off + 1)..<(off + 1 + size - 8)].contains(where: { $0 != 0 }) {
                throw Self.fail(
                    "object \(index) at \(hex(off)): UID of \(size) bytes does not fit in 64 bits")
            }
            let used = min(size, 8)
            return .leaf(.uid(be(off + 1 + size - used, used)), bytes: 0)
        case 0xA:
            let (count, start) = try sizedHeader(index, off, marker)
            _ = try checkPayload(index, off, start, count: count, unit: refSize, what: "array")
            return .container(isDictionary: false, count: count, refs: start)
        case 0xD:
            let (count, start) = try sizedHeader(index, off, marker)
            let (pairs, overflow) = count.multipliedReportingOverflow(by: 2)
            guard !overflow else {
                throw Self.fail("object \(index) at \(hex(off)): dictionary count \(count) is too large")
            }
            _ = try checkPayload(index, off, start, count: pairs, unit: refSize, what: "dictionary")
            return .container(isDictionary: true, count: count, refs: start)
        case 0xB:
            throw Self.fail(
                "object \(index) at \(hex(off)): ordered sets (marker \(hex(Int(marker)))) are not supported")
        case 0xC:
            throw Self.fail(
                "object \(index) at \(hex(off)): sets (marker \(hex(Int(marker)))) are not supported")
        default:
            throw Self.fail("object \(index) at \(hex(off)): unknown marker \(hex(Int(marker)))")
        }
    }

    struct Done {
        var value: PropertyListValue
        var nodes: Int
        var bytes: Int
        var height: Int
    }

    struct Frame {
        let index: Int
        let isDictionary: Bool
        let count: Int
        let refs: Int
        var next = 0
        var keys: [String] = []
        var seen: Set<ExactString> = []
        var values: [PropertyListValue] = []
        var nodes = 1
        var bytes = 0
        var height = 1
    }

    mutating func decode() throws(PropertyListError) -> PropertyListValue {
        try readTrailer()
        let root: Object = try object(topObject)
        guard case .container(let isDict, let count, let refs) = root else {
            if case .leaf(let v, _) = root { return v }
            throw Self.fail("internal error")
        }
        guard limits.maximumDepth >= 1 else {
            throw Self.fail("nesting deeper than the limit of \(limits.maximumDepth)")
        }
        // Per object: -1 not seen, -2 on the current path, else its index in `memo`.
        // (4 bytes per object; the trailer's object count is bounded by the file size.)
        var state = [Int32](repeating: -1, count: objectCount)
        var memo: [Done] = []
        state[topObject] = -2
        var stack: [Frame] = [Frame(index: topObject, isDictionary: isDict, count: count, refs: refs)]
        stack[0].values.reserveCapacity(min(count, 1 << 16))
        if isDict { stack[0].keys.reserveCapacity(min(count, 1 << 16)) }

        while !stack.isEmpty {
            let fi = stack.count - 1
            let total = stack[fi].isDictionary ? stack[fi].count * 2 : stack[fi].count
            if stack[fi].next == total {
                let f = stack.removeLast()
                let value: PropertyListValue
                if f.isDictionary {
                    var entries: [PropertyListValue.Entry] = []
                    entries.reserveCapacity(f.count)
                    for i in 0..<f.count { entries.append(.init(key: f.keys[i], value: f.values[i])) }
                    value = .dictionary(entries)
                } else {
                    value = .array(f.values)
                }
                let done = Done(value: value, nodes: f.nodes, bytes: f.bytes, height: f.height)
                state[f.index] = Int32(memo.count)
                memo.append(done)
                if stack.isEmpty { return value }
                try deliver(done, to: &stack[stack.count - 1], depth: stack.count)
                continue
            }
            let i = stack[fi].next
            stack[fi].next += 1
            let owner = stack[fi].index
            let child = try reference(at: stack[fi].refs + i * refSize, owner: owner)
            if stack[fi].isDictionary && i < stack[fi].count {
                let key = try object(child)
                guard case .leaf(.string(let s), let bytes) = key else {
                    let off = try offset(of: child)
                    throw Self.fail(
                        "dictionary (object \(owner)) key #\(i) is object \(child) (\(Self.typeName(b[off]))), not a string"
                    )
                }
                let duplicate: Bool
                if stack[fi].count <= 16 {
                    duplicate = stack[fi].keys.contains { exactEqual($0, s) }
                } else {
                    duplicate = !stack[fi].seen.insert(ExactString(s)).inserted
                }
                if duplicate {
                    throw Self.fail("dictionary (object \(owner)) has duplicate key \"\(s)\"")
                }
                stack[fi].keys.append(s)
                try deliverLeafCounts(bytes: bytes, to: &stack[fi])
                continue
            }
            let childState = state[child]
            if childState >= 0 {
                try deliver(memo[Int(childState)], to: &stack[fi], depth: stack.count)
                continue
            }
            if childState == -2 {
                throw Self.fail("object \(child) contains itself (reference cycle through object \(owner))")
            }
            switch try object(child) {
            case .leaf(let v, let bytes):
                stack[fi].values.append(v)
                try deliverLeafCounts(bytes: bytes, to: &stack[fi])
            case .container(let isDict, let count, let refs):
                guard stack.count < limits.maximumDepth else {
                    throw Self.fail(
                        "nesting deeper than the limit of \(limits.maximumDepth) (object \(child))")
                }
                state[child] = -2
                var frame = Frame(index: child, isDictionary: isDict, count: count, refs: refs)
                frame.values.reserveCapacity(min(count, 1 << 16))
                if isDict { frame.keys.reserveCapacity(min(count, 1 << 16)) }
                stack.append(frame)
            }
        }
        throw Self.fail("internal error")
    }

    func deliverLeafCounts(bytes: Int, to frame: inout Frame) throws(PropertyListError) {
        frame.nodes += 1
        frame.bytes += bytes
        try checkExpansion(frame)
    }

    /// Adds a finished container to its parent; `depth` is the parent's depth.
    func deliver(_ done: Done, to frame: inout Frame, depth: Int) throws(PropertyListError) {
        guard depth + done.height <= limits.maximumDepth else {
            throw Self.fail("nesting deeper than the limit of \(limits.maximumDepth)")
        }
        frame.values.append(done.value)
        frame.nodes += done.nodes
        frame.bytes += done.bytes
        frame.height = max(frame.height, done.height + 1)
        try checkExpansion(frame)
    }

    func checkExpansion(_ frame: Frame) throws(PropertyListError) {
        if frame.nodes > limits.maximumObjectCount {
            throw Self.fail(
                "the decoded value would hold more than \(limits.maximumObjectCount) objects (shared objects count once per reference; object \(frame.index))"
            )
        }
        if frame.bytes > limits.maximumSize {
            throw Self.fail(
                "the decoded value would hold more than \(limits.maximumSize) bytes of strings and data (shared objects count once per reference; object \(frame.index))"
            )
        }
    }
}
