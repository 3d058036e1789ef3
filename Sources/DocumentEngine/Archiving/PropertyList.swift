// PropertyList.swift — DocFS DocumentEngine
//
// A self-contained property-list codec: binary ("bplist00") and XML readers and
// writers, plus a `plutil -p`-style describer. Foundation is used only for `Data`,
// base64 encoding and `log10`; no PropertyListSerialization, no XMLParser.
//
// Readers are written for hostile input: every offset, count and size is
// bounds-checked with overflow-safe arithmetic, nesting and object counts are
// limited, and neither reader recurses (both use explicit stacks), so nesting
// depth cannot exhaust the call stack. Writers recurse once per nesting level
// of the value they are given.

import Foundation

// MARK: - Value

/// One value of a property list. Dictionaries keep their keys' order (binary and XML both have one).
///
/// Equality is exact and structural: strings compare by their Unicode scalars
/// (not by canonical equivalence, so "é" and "e\u{301}" differ, as they do in a
/// plist), reals and dates compare by bit pattern (so NaN equals the same NaN and
/// 0.0 differs from -0.0), dictionaries compare entry by entry in order.
public enum PropertyListValue: Sendable {
    case string(String)
    /// Plist range: `Int64.min ... UInt64.max`. Readers never produce values outside it;
    /// writers write what they are given (see docs/library/property-lists.md).
    case integer(Int128)
    case real(Double)
    case bool(Bool)
    /// Seconds since 2001-01-01 00:00:00 UTC (Apple's reference date), exact.
    case date(Double)
    case data(Data)
    case array([PropertyListValue])
    case dictionary([Entry])
    /// Keyed-archive reference (`CF$UID`).
    case uid(UInt64)

    /// One key–value pair of a dictionary.
    public struct Entry: Sendable, Hashable {
        public var key: String
        public var value: PropertyListValue

        public init(key: String, value: PropertyListValue) {
            self.key = key
            self.value = value
        }

        public init(_ key: String, _ value: PropertyListValue) {
            self.key = key
            self.value = value
        }

        public static func == (a: Entry, b: Entry) -> Bool {
            exactEqual(a.key, b.key) && a.value == b.value
        }

        public func hash(into hasher: inout Hasher) {
            exactHash(key, into: &hasher)
            hasher.combine(value)
        }
    }
}

extension PropertyListValue: Hashable {
    public static func == (a: PropertyListValue, b: PropertyListValue) -> Bool {
        switch (a, b) {
        case (.string(let x), .string(let y)): return exactEqual(x, y)
        case (.integer(let x), .integer(let y)): return x == y
        case (.real(let x), .real(let y)): return x.bitPattern == y.bitPattern
        case (.bool(let x), .bool(let y)): return x == y
        case (.date(let x), .date(let y)): return x.bitPattern == y.bitPattern
        case (.data(let x), .data(let y)): return x == y
        case (.array(let x), .array(let y)): return x == y
        case (.dictionary(let x), .dictionary(let y)): return x == y
        case (.uid(let x), .uid(let y)): return x == y
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .string(let s):
            hasher.combine(0 as UInt8)
            exactHash(s, into: &hasher)
        case .integer(let i):
            hasher.combine(1 as UInt8)
            hasher.combine(i)
        case .real(let d):
            hasher.combine(2 as UInt8)
            hasher.combine(d.bitPattern)
        case .bool(let b):
            hasher.combine(3 as UInt8)
            hasher.combine(b)
        case .date(let d):
            hasher.combine(4 as UInt8)
            hasher.combine(d.bitPattern)
        case .data(let d):
            hasher.combine(5 as UInt8)
            hasher.combine(d)
        case .array(let a):
            hasher.combine(6 as UInt8)
            hasher.combine(a)
        case .dictionary(let e):
            hasher.combine(7 as UInt8)
            hasher.combine(e)
        case .uid(let u):
            hasher.combine(8 as UInt8)
            hasher.combine(u)
        }
    }
}

extension PropertyListValue: ExpressibleByStringLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int128) { self = .integer(value) }
    public init(floatLiteral value: Double) { self = .real(value) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: PropertyListValue...) { self = .array(elements) }
    /// Keeps the literal's order.
    public init(dictionaryLiteral elements: (String, PropertyListValue)...) {
        self = .dictionary(elements.map { Entry(key: $0.0, value: $0.1) })
    }
}

extension PropertyListValue {
    /// The value for `key` if this is a dictionary holding it (exact key match), else nil.
    public subscript(key: String) -> PropertyListValue? {
        guard case .dictionary(let entries) = self else { return nil }
        return entries.first { exactEqual($0.key, key) }?.value
    }

    /// A copy whose dictionaries (at every depth) have their keys in UTF-16 code-unit
    /// order, which is the order CF's XML writer uses. `encodeXML(v.sortedKeys())`
    /// reproduces CF's XML byte for byte.
    public func sortedKeys() -> PropertyListValue {
        switch self {
        case .array(let items):
            return .array(items.map { $0.sortedKeys() })
        case .dictionary(let entries):
            let sorted = entries.map { Entry(key: $0.key, value: $0.value.sortedKeys()) }
                .sorted { $0.key.utf16.lexicographicallyPrecedes($1.key.utf16) }
            return .dictionary(sorted)
        default:
            return self
        }
    }
}

// MARK: - Error

/// Why a property list could not be read.
public struct PropertyListError: Error, Sendable, Hashable, CustomStringConvertible {
    /// 1-based line of the problem (XML only).
    public var line: Int?
    /// 1-based column of the problem, counted in Unicode scalars from the start of the line
    /// (a leading byte-order mark is not counted; tabs count as one). XML only.
    public var column: Int?
    /// What was expected and what was found, e.g. "expected </integer>, found </integr>".
    public var reason: String

    public init(_ reason: String, line: Int? = nil, column: Int? = nil) {
        self.reason = reason
        self.line = line
        self.column = column
    }

    /// "line 5, column 3: <reason>" when the location is known, else just the reason.
    public var description: String {
        switch (line, column) {
        case (let l?, let c?): return "line \(l), column \(c): \(reason)"
        case (let l?, nil): return "line \(l): \(reason)"
        default: return reason
        }
    }
}

// MARK: - API

public enum PropertyList {
    /// Bounds for the readers. The defaults accept anything CF writes in practice.
    public struct Limits: Sendable, Hashable {
        /// Largest input, in bytes. For binary input it also bounds the total size of the
        /// strings and data of the decoded value, counting shared objects once per reference.
        public var maximumSize: Int
        /// Deepest nesting of arrays and dictionaries (a top-level container is depth 1).
        public var maximumDepth: Int
        /// Most objects: binary trailer object count, and the number of values and keys of
        /// the decoded value (shared binary objects count once per reference, so a small
        /// file whose references fan out cannot decode into a huge tree).
        public var maximumObjectCount: Int

        public init(maximumSize: Int = 64 << 20, maximumDepth: Int = 512, maximumObjectCount: Int = 1 << 22) {
            self.maximumSize = maximumSize
            self.maximumDepth = maximumDepth
            self.maximumObjectCount = maximumObjectCount
        }

        public static let standard = Limits()
    }

    /// How the binary writer shares equal leaf objects.
    public enum BinaryUniquing: Sendable, Hashable {
        /// Equal strings, integers, reals, dates, data and UIDs are written once and shared.
        /// Booleans are treated as CF treats them (see docs/library/property-lists.md). The default.
        case byValue
        /// Reproduces what swift-corelibs-foundation writes for values it bridged from
        /// Swift, where sharing follows object identity: strings, data and dates are
        /// never shared; integers -1...12 and reals 0.0, 1.0, ±infinity and NaN are
        /// shared (CF caches those numbers); booleans and UIDs are written once per
        /// occurrence but every reference points at the first copy.
        case corelibs
    }

    static let binaryMagic: [UInt8] = Array("bplist00".utf8)

    /// Whether `data` starts with the binary magic "bplist00".
    public static func isBinary(_ data: Data) -> Bool {
        data.count >= 8 && data.prefix(8).elementsEqual(binaryMagic)
    }

    /// Whether `bytes` starts with the binary magic "bplist00".
    public static func isBinary<C: Collection>(_ bytes: C) -> Bool where C.Element == UInt8 {
        bytes.prefix(8).elementsEqual(binaryMagic)
    }

    /// Decodes binary or XML, chosen by the "bplist00" magic.
    public static func decode(_ data: Data, limits: Limits = .standard) throws(PropertyListError)
        -> PropertyListValue
    {
        isBinary(data) ? try decodeBinary(data, limits: limits) : try decodeXML(data, limits: limits)
    }

    public static func decodeBinary(_ data: Data, limits: Limits = .standard) throws(PropertyListError)
        -> PropertyListValue
    {
        guard data.count <= limits.maximumSize else {
            throw PropertyListError(
                "binary: input is \(data.count) bytes, more than the limit of \(limits.maximumSize)")
        }
        var reader = BinaryReader(bytes: [UInt8](data), limits: limits)
        return try reader.decode()
    }

    public static func encodeBinary(_ value: PropertyListValue, uniquing: BinaryUniquing = .byValue) -> Data {
        var writer = BinaryWriter(uniquing: uniquing)
        return writer.encode(value)
    }

    /// CF's XML layout, byte for byte, except that dictionary keys keep the value's order
    /// (CF sorts them; use `sortedKeys()` first to match) and dates with a fractional
    /// second keep it as `2001-01-01T00:00:01.25Z` (CF drops it, and CF's reader rejects
    /// that form). Pass `dropDateFractions: true` to write whole seconds (rounded down) as
    /// CF does, for files Apple's tools must read.
    public static func encodeXML(_ value: PropertyListValue, dropDateFractions: Bool = false) -> Data {
        var out: [UInt8] = []
        out.reserveCapacity(256)
        out.append(contentsOf: xmlHeader)
        XMLWriter(dropDateFractions: dropDateFractions).write(value, indent: 0, into: &out)
        out.append(contentsOf: Array("</plist>\n".utf8))
        return Data(out)
    }

    public static func decodeXML(_ data: Data, limits: Limits = .standard) throws(PropertyListError)
        -> PropertyListValue
    {
        guard data.count <= limits.maximumSize else {
            throw PropertyListError(
                "input is \(data.count) bytes, more than the limit of \(limits.maximumSize)")
        }
        var reader = XMLReader(bytes: [UInt8](data), limits: limits)
        return try reader.parseDocument()
    }

    /// Pretty text for humans, like `plutil -p`.
    public static func describe(_ value: PropertyListValue) -> String {
        var out = ""
        Describer.describe(value, level: 0, into: &out)
        return out
    }

    static let xmlHeader: [UInt8] = Array(
        """
        <?xml version="1.0" encoding="UTF-8"?>
        <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
        <plist version="1.0">

        """.utf8)
}

// MARK: - Shared helpers

/// Exact equality of two strings: same Unicode scalars (Swift's `==` uses canonical equivalence).
@inline(__always) func exactEqual(_ a: String, _ b: String) -> Bool {
    let au = a.utf8
    let bu = b.utf8
    guard au.count == bu.count else { return false }
    let fast: Bool? =
        au.withContiguousStorageIfAvailable { pa in
            bu.withContiguousStorageIfAvailable { pb in
                guard let x = pa.baseAddress, let y = pb.baseAddress else { return true }  // both empty
                return memcmp(x, y, pa.count) == 0
            }
        } ?? nil
    return fast ?? au.elementsEqual(bu)
}

/// Hashes a string's UTF-8 bytes (consistent with `exactEqual`).
@inline(__always) func exactHash(_ s: String, into hasher: inout Hasher) {
    let done: Void? = s.utf8.withContiguousStorageIfAvailable {
        hasher.combine(bytes: UnsafeRawBufferPointer($0))
    }
    if done == nil { for byte in s.utf8 { hasher.combine(byte) } }
    hasher.combine(s.utf8.count)
}

/// A string compared by its exact scalars.
struct ExactString: Hashable {
    let string: String
    init(_ s: String) { string = s }
    static func == (a: ExactString, b: ExactString) -> Bool { exactEqual(a.string, b.string) }
    func hash(into hasher: inout Hasher) { exactHash(string, into: &hasher) }
}

@inline(__always) func hex(_ v: Int) -> String { "0x" + String(v, radix: 16) }

/// Calendar arithmetic: proleptic Gregorian, astronomical year numbering (year 0 exists),
/// as CF's CFAbsoluteTimeGetGregorianDate.
enum PlistCalendar {
    /// Days from 1970-01-01 to 2001-01-01.
    static let referenceDay: Int64 = 11323

    static func civil(fromDays z0: Int64) -> (year: Int64, month: Int, day: Int) {
        let z = z0 + 719468
        let era = (z >= 0 ? z : z - 146096) / 146097
        let doe = z - era * 146097
        let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), Int(m), Int(d))
    }

    /// Days since 1970-01-01. `y` must be within a few times 10^11.
    static func days(year y0: Int64, month m: Int, day d: Int) -> Int64 {
        let y = m <= 2 ? y0 - 1 : y0
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let mp = Int64(m > 2 ? m - 3 : m + 9)
        let doy = (153 * mp + 2) / 5 + Int64(d) - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146097 + doe - 719468
    }

    static func isLeap(_ y: Int64) -> Bool { (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 }

    static func daysIn(month: Int, year: Int64) -> Int {
        switch month {
        case 2: return isLeap(year) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Dates with |t| below this are written as calendar dates; beyond it (and NaN/inf)
    /// as a real number of seconds (an extension; see docs/library/property-lists.md).
    static let calendarLimit: Double = 2_305_843_009_213_693_952  // 2^61

    struct Parts {
        var year: Int64, month: Int, day: Int, hour: Int, minute: Int, second: Int
        /// Fraction digits after the decimal point ("" for a whole second).
        var fraction: String
    }

    /// Splits a finite date with |t| < calendarLimit into calendar fields plus the
    /// shortest fraction digits that reproduce `t` exactly.
    static func parts(_ t: Double) -> Parts {
        let whole = t.rounded(.down)
        let w = Int64(whole)
        var dayNumber = w / 86400
        var secs = w % 86400
        if secs < 0 {
            secs += 86400
            dayNumber -= 1
        }
        let (y, m, d) = civil(fromDays: dayNumber + referenceDay)
        let s = Int(secs)
        var fraction = ""
        if whole != t { fraction = fractionDigits(t) }
        return Parts(
            year: y, month: m, day: d, hour: s / 3600, minute: (s / 60) % 60, second: s % 60,
            fraction: fraction)
    }

    /// Digits d1...dk such that floor(t) + 0.d1...dk, parsed as a decimal, is exactly t,
    /// with k as small as possible. `t` is finite and not integral.
    static func fractionDigits(_ t: Double) -> String {
        let (_, _, frac) = exactDecimal(t.magnitude.description)
        guard !frac.isEmpty else { return "" }
        return t < 0 ? complement(frac) : frac
    }

    /// 10^k - f for the k-digit string f (whose last digit is not 0), as k digits.
    static func complement(_ f: String) -> String {
        var digits = Array(f.utf8).map { $0 - 48 }
        guard let last = digits.indices.last else { return "" }
        for i in digits.indices { digits[i] = i == last ? 10 - digits[i] : 9 - digits[i] }
        return String(decoding: digits.map { $0 + 48 }, as: UTF8.self)
    }

    /// Expands a Swift float description ("123.45", "1e-05", "1.25e+22") into
    /// integer digits and fraction digits (trailing zeros removed).
    static func exactDecimal(_ s: String) -> (negative: Bool, int: String, frac: String) {
        var chars = Array(s.utf8)
        var negative = false
        if chars.first == UInt8(ascii: "-") {
            negative = true
            chars.removeFirst()
        }
        var exponent = 0
        if let e = chars.firstIndex(where: { $0 == UInt8(ascii: "e") || $0 == UInt8(ascii: "E") }) {
            exponent = Int(String(decoding: chars[(e + 1)...], as: UTF8.self)) ?? 0
            chars.removeSubrange(e...)
        }
        var digits: [UInt8] = []
        var point = chars.count
        for (i, c) in chars.enumerated() {
            if c == UInt8(ascii: ".") { point = i } else { digits.append(c) }
        }
        if point > digits.count { point = digits.count }
        point += exponent
        var intPart: [UInt8]
        var fracPart: [UInt8]
        if point <= 0 {
            intPart = [UInt8(ascii: "0")]
            fracPart = [UInt8](repeating: UInt8(ascii: "0"), count: -point) + digits
        } else if point >= digits.count {
            intPart = digits + [UInt8](repeating: UInt8(ascii: "0"), count: point - digits.count)
            fracPart = []
        } else {
            intPart = Array(digits[..<point])
            fracPart = Array(digits[point...])
        }
        while fracPart.last == UInt8(ascii: "0") { fracPart.removeLast() }
        while intPart.count > 1 && intPart.first == UInt8(ascii: "0") { intPart.removeFirst() }
        return (negative, String(decoding: intPart, as: UTF8.self), String(decoding: fracPart, as: UTF8.self))
    }

    /// The exact inverse of `parts`: whole seconds `w` since the reference date plus
    /// fraction digits, correctly rounded to a Double.
    static func seconds(whole w: Int64, fraction: String) -> Double? {
        var f = Array(fraction.utf8)
        while f.last == UInt8(ascii: "0") { f.removeLast() }
        if f.isEmpty { return Double(w) }
        let text: String
        if w >= 0 {
            text = "\(w)." + String(decoding: f, as: UTF8.self)
        } else {
            // w + 0.f = -((|w| - 1) + (1 - 0.f))
            text = "-\(w.magnitude - 1)." + complement(String(decoding: f, as: UTF8.self))
        }
        return Double(text)
    }

    static func pad(_ v: Int64, _ width: Int) -> String {
        let s = String(v.magnitude)
        let body = s.count < width ? String(repeating: "0", count: width - s.count) + s : s
        return v < 0 ? "-" + body : body
    }

    /// CF's "%04d" year: at least four characters including the sign.
    static func yearText(_ y: Int64) -> String { y < 0 ? pad(y, 3) : pad(y, 4) }
}

// MARK: - Real formatting (CF's "%.17g")

/// A small unsigned big integer, enough for exact decimal expansion of a Double.
struct BigNum {
    var limbs: [UInt32]

    init(_ v: UInt64) {
        limbs = [UInt32(truncatingIfNeeded: v), UInt32(truncatingIfNeeded: v >> 32)]
        trim()
    }

    mutating func trim() {
        while let l = limbs.last, l == 0 { limbs.removeLast() }
    }

    mutating func multiply(by m: UInt32) {
        var carry: UInt64 = 0
        for i in limbs.indices {
            let p = UInt64(limbs[i]) * UInt64(m) + carry
            limbs[i] = UInt32(truncatingIfNeeded: p)
            carry = p >> 32
        }
        if carry != 0 { limbs.append(UInt32(truncatingIfNeeded: carry)) }
    }

    mutating func shiftLeft(_ n: Int) {
        guard !limbs.isEmpty, n > 0 else { return }
        let words = n / 32
        let bits = n % 32
        if bits != 0 {
            var carry: UInt32 = 0
            for i in limbs.indices {
                let v = limbs[i]
                limbs[i] = (v << UInt32(bits)) | carry
                carry = v >> UInt32(32 - bits)
            }
            if carry != 0 { limbs.append(carry) }
        }
        if words > 0 { limbs.insert(contentsOf: repeatElement(0, count: words), at: 0) }
    }

    static func compare(_ a: BigNum, _ b: BigNum) -> Int {
        if a.limbs.count != b.limbs.count { return a.limbs.count < b.limbs.count ? -1 : 1 }
        var i = a.limbs.count - 1
        while i >= 0 {
            if a.limbs[i] != b.limbs[i] { return a.limbs[i] < b.limbs[i] ? -1 : 1 }
            i -= 1
        }
        return 0
    }

    /// self -= b, where self >= b.
    mutating func subtract(_ b: BigNum) {
        var borrow: Int64 = 0
        for i in limbs.indices {
            var d = Int64(limbs[i]) - borrow - (i < b.limbs.count ? Int64(b.limbs[i]) : 0)
            if d < 0 {
                d += 1 << 32
                borrow = 1
            } else {
                borrow = 0
            }
            limbs[i] = UInt32(truncatingIfNeeded: d)
        }
        trim()
    }
}

enum RealFormat {
    /// CF's text for a real: "%.17g", except 0 → "0.0" (and -0.0 → "-0.0", where CF loses the
    /// sign), ±inf → "+infinity"/"-infinity", NaN → "nan".
    static func cf(_ d: Double) -> String {
        if d.isNaN { return "nan" }
        if d.isInfinite { return d < 0 ? "-infinity" : "+infinity" }
        // CF writes -0.0 as "0.0" too; the sign is kept here, so that text read back is the
        // same value (CF's reader takes "-0.0").
        if d == 0 { return d.sign == .minus ? "-0.0" : "0.0" }
        let (digits, x) = seventeenDigits(d.magnitude)
        return (d < 0 ? "-" : "") + gFormat(digits, x)
    }

    /// The first 17 significant digits of v (finite, > 0), correctly rounded (ties to even),
    /// and the decimal exponent of the first digit.
    static func seventeenDigits(_ v: Double) -> ([UInt8], Int) {
        let normal = v.exponentBitPattern != 0
        let mantissa = v.significandBitPattern | (normal ? (1 << 52) : 0)
        let e2 = normal ? Int(v.exponentBitPattern) - 1075 : -1074
        var num = BigNum(mantissa)
        var den = BigNum(1)
        if e2 >= 0 { num.shiftLeft(e2) } else { den.shiftLeft(-e2) }
        var x = Int(log10(v).rounded(.down))
        if x >= 0 {
            for _ in 0..<x { den.multiply(by: 10) }
        } else {
            for _ in 0..<(-x) { num.multiply(by: 10) }
        }
        while BigNum.compare(num, den) < 0 {
            num.multiply(by: 10)
            x -= 1
        }
        while true {
            var den10 = den
            den10.multiply(by: 10)
            if BigNum.compare(num, den10) >= 0 {
                den = den10
                x += 1
            } else {
                break
            }
        }
        var digits: [UInt8] = []
        digits.reserveCapacity(17)
        for _ in 0..<17 {
            var d: UInt8 = 0
            while BigNum.compare(num, den) >= 0 {
                num.subtract(den)
                d += 1
            }
            digits.append(d)
            num.multiply(by: 10)
        }
        var half = den
        half.multiply(by: 5)
        let c = BigNum.compare(num, half)
        if c > 0 || (c == 0 && digits[16] & 1 == 1) {
            var i = 16
            while i >= 0 {
                if digits[i] == 9 {
                    digits[i] = 0
                    i -= 1
                } else {
                    digits[i] += 1
                    break
                }
            }
            if i < 0 {
                digits = [1] + [UInt8](repeating: 0, count: 16)
                x += 1
            }
        }
        return (digits, x)
    }

    static func gFormat(_ digits: [UInt8], _ x: Int) -> String {
        func text(_ ds: ArraySlice<UInt8>) -> String { String(decoding: ds.map { $0 + 48 }, as: UTF8.self) }
        var end = digits.count
        while end > 1 && digits[end - 1] == 0 { end -= 1 }
        if x < -4 || x >= 17 {
            var s = text(digits[0..<1])
            if end > 1 { s += "." + text(digits[1..<end]) }
            let ax = x.magnitude
            return s + (x < 0 ? "e-" : "e+") + (ax < 10 ? "0" : "") + String(ax)
        }
        if x >= 0 {
            var s = text(digits[0...x])
            if end > x + 1 { s += "." + text(digits[(x + 1)..<end]) }
            return s
        }
        return "0." + String(repeating: "0", count: -x - 1) + text(digits[0..<end])
    }
}

// MARK: - Binary reader

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

// MARK: - Binary writer

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

// MARK: - XML writer

struct XMLWriter {
    let dropDateFractions: Bool

    static func tabs(_ n: Int, _ out: inout [UInt8]) {
        for _ in 0..<max(n, 0) { out.append(0x09) }
    }

    static func append(_ s: String, _ out: inout [UInt8]) { out.append(contentsOf: s.utf8) }

    static func escaped(_ s: String, _ out: inout [UInt8]) {
        for c in s.utf8 {
            switch c {
            case UInt8(ascii: "<"): append("&lt;", &out)
            case UInt8(ascii: ">"): append("&gt;", &out)
            case UInt8(ascii: "&"): append("&amp;", &out)
            default: out.append(c)
            }
        }
    }

    static func dateText(_ t: Double) -> String {
        guard t.isFinite, t.magnitude < PlistCalendar.calendarLimit else { return RealFormat.cf(t) }
        let p = PlistCalendar.parts(t)
        func two(_ v: Int) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return PlistCalendar.yearText(p.year) + "-" + two(p.month) + "-" + two(p.day) + "T" + two(p.hour)
            + ":"
            + two(p.minute) + ":" + two(p.second) + (p.fraction.isEmpty ? "" : "." + p.fraction) + "Z"
    }

    func write(_ value: PropertyListValue, indent: Int, into out: inout [UInt8]) {
        let tabs = Self.tabs
        let append = Self.append
        let escaped = Self.escaped
        tabs(indent, &out)
        switch value {
        case .string(let s):
            append("<string>", &out)
            escaped(s, &out)
            append("</string>\n", &out)
        case .integer(let i):
            append("<integer>\(i)</integer>\n", &out)
        case .real(let d):
            append("<real>" + RealFormat.cf(d) + "</real>\n", &out)
        case .bool(let b):
            append(b ? "<true/>\n" : "<false/>\n", &out)
        case .date(let t):
            append("<date>" + Self.dateText(dropDateFractions ? t.rounded(.down) : t) + "</date>\n", &out)
        case .data(let d):
            append("<data>\n", &out)
            let lineIndent = min(indent, 8)
            let lineLength = 76 - 8 * lineIndent
            let encoded = Array(d.base64EncodedString().utf8)
            var start = 0
            while start < encoded.count {
                let end = min(start + lineLength, encoded.count)
                tabs(lineIndent, &out)
                out.append(contentsOf: encoded[start..<end])
                out.append(0x0A)
                start = end
            }
            tabs(indent, &out)
            append("</data>\n", &out)
        case .array(let items):
            if items.isEmpty {
                append("<array/>\n", &out)
                return
            }
            append("<array>\n", &out)
            for item in items { write(item, indent: indent + 1, into: &out) }
            tabs(indent, &out)
            append("</array>\n", &out)
        case .dictionary(let entries):
            if entries.isEmpty {
                append("<dict/>\n", &out)
                return
            }
            append("<dict>\n", &out)
            for e in entries {
                tabs(indent + 1, &out)
                append("<key>", &out)
                escaped(e.key, &out)
                append("</key>\n", &out)
                write(e.value, indent: indent + 1, into: &out)
            }
            tabs(indent, &out)
            append("</dict>\n", &out)
        case .uid(let u):
            append("<dict>\n", &out)
            tabs(indent + 1, &out)
            append("<key>CF$UID</key>\n", &out)
            tabs(indent + 1, &out)
            append("<integer>\(u)</integer>\n", &out)
            tabs(indent, &out)
            append("</dict>\n", &out)
        }
    }
}

// MARK: - XML reader

struct XMLReader {
    let b: [UInt8]
    let limits: PropertyList.Limits
    var p = 0
    var bom = 0
    var objects = 0

    init(bytes: [UInt8], limits: PropertyList.Limits) {
        b = bytes
        self.limits = limits
    }

    // MARK: errors and positions

    func location(_ pos: Int) -> (line: Int, column: Int) {
        let end = min(max(pos, 0), b.count)
        var line = 1
        var lineStart = min(bom, end)
        var i = lineStart
        while i < end {
            if b[i] == 0x0A {
                line += 1
                lineStart = i + 1
            }
            i += 1
        }
        var column = 1
        i = lineStart
        while i < end {
            if b[i] & 0xC0 != 0x80 { column += 1 }
            i += 1
        }
        return (line, column)
    }

    func error(_ reason: String, at pos: Int) -> PropertyListError {
        let (l, c) = location(pos)
        return PropertyListError(reason, line: l, column: c)
    }

    /// A short rendering of what is at `pos`, for "found ..." messages.
    func found(at pos: Int) -> String {
        guard pos < b.count else { return "end of input" }
        if b[pos] == UInt8(ascii: "<") {
            var e = pos
            while e < b.count && e - pos < 60 && b[e] != UInt8(ascii: ">") { e += 1 }
            let closed = e < b.count && b[e] == UInt8(ascii: ">")
            return String(decoding: b[pos..<(closed ? e + 1 : e)], as: UTF8.self) + (closed ? "" : "…")
        }
        var e = pos
        while e < b.count && e - pos < 24 && b[e] != UInt8(ascii: "<") && b[e] != 0x0A { e += 1 }
        return "text \"" + String(decoding: b[pos..<e], as: UTF8.self) + "\""
    }

    // MARK: low-level scanning

    @inline(__always) static func isSpace(_ c: UInt8) -> Bool {
        c == 0x20 || c == 0x09 || c == 0x0A || c == 0x0D
    }

    @inline(__always) static func isNameStart(_ c: UInt8) -> Bool {
        (c >= 0x61 && c <= 0x7A) || (c >= 0x41 && c <= 0x5A) || c == UInt8(ascii: "_")
            || c == UInt8(ascii: ":")
    }

    @inline(__always) static func isNameChar(_ c: UInt8) -> Bool {
        isNameStart(c) || (c >= 0x30 && c <= 0x39) || c == UInt8(ascii: "-") || c == UInt8(ascii: ".")
    }

    func has(_ s: StaticString, at pos: Int) -> Bool {
        let n = s.utf8CodeUnitCount
        guard pos + n <= b.count else { return false }
        return s.withUTF8Buffer { buf in
            var i = 0
            while i < n {
                if b[pos + i] != buf[i] { return false }
                i += 1
            }
            return true
        }
    }

    func find(_ s: StaticString, from pos: Int) -> Int? {
        var i = pos
        let first = s.withUTF8Buffer { $0[0] }
        while i < b.count {
            if b[i] == first && has(s, at: i) { return i }
            i += 1
        }
        return nil
    }

    mutating func skipSpace() {
        while p < b.count && Self.isSpace(b[p]) { p += 1 }
    }

    /// Skips whitespace, comments and (if allowed) processing instructions.
    mutating func skipMisc(processingInstructions: Bool) throws(PropertyListError) {
        while true {
            skipSpace()
            if has("<!--", at: p) {
                guard let end = find("-->", from: p + 4) else { throw error("unterminated comment", at: p) }
                p = end + 3
            } else if processingInstructions && has("<?", at: p) {
                guard let end = find("?>", from: p + 2) else {
                    throw error("unterminated processing instruction", at: p)
                }
                p = end + 2
            } else {
                return
            }
        }
    }

    /// Index of the first invalid UTF-8 byte in b[from..<to], if any.
    func invalidUTF8(_ from: Int, _ to: Int) -> Int? {
        var i = from
        while i < to {
            let c = b[i]
            if c < 0x80 {
                i += 1
                continue
            }
            let need: Int
            var lowest: UInt32
            var v: UInt32
            if c & 0xE0 == 0xC0 {
                need = 1
                lowest = 0x80
                v = UInt32(c & 0x1F)
            } else if c & 0xF0 == 0xE0 {
                need = 2
                lowest = 0x800
                v = UInt32(c & 0x0F)
            } else if c & 0xF8 == 0xF0 {
                need = 3
                lowest = 0x10000
                v = UInt32(c & 0x07)
            } else {
                return i
            }
            guard i + need < to else { return i }
            for k in 1...need {
                let cc = b[i + k]
                guard cc & 0xC0 == 0x80 else { return i }
                v = v << 6 | UInt32(cc & 0x3F)
            }
            if v < lowest || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) { return i }
            i += need + 1
        }
        return nil
    }

    func name(at pos: Int) -> (String, Int)? {
        guard pos < b.count, Self.isNameStart(b[pos]) else { return nil }
        var e = pos + 1
        while e < b.count && Self.isNameChar(b[e]) { e += 1 }
        return (String(decoding: b[pos..<e], as: UTF8.self), e)
    }

    struct Tag {
        var name: String
        var selfClosing: Bool
        var start: Int
    }

    /// Parses `<name attr="v" ...>` or `.../>` at p (b[p] == '<'). Attributes are checked for
    /// well-formedness and ignored.
    mutating func startTag() throws(PropertyListError) -> Tag {
        let start = p
        guard let (n, e) = name(at: p + 1) else {
            throw error("expected an element name after '<', found \(found(at: p))", at: p)
        }
        p = e
        while true {
            let before = p
            skipSpace()
            guard p < b.count else { throw error("unterminated tag <\(n)", at: start) }
            if b[p] == UInt8(ascii: ">") {
                p += 1
                return Tag(name: n, selfClosing: false, start: start)
            }
            if has("/>", at: p) {
                p += 2
                return Tag(name: n, selfClosing: true, start: start)
            }
            guard p > before, let (_, ae) = name(at: p) else {
                throw error("malformed tag <\(n)>: unexpected \(found(at: p))", at: p)
            }
            p = ae
            skipSpace()
            guard p < b.count, b[p] == UInt8(ascii: "=") else {
                throw error("malformed attribute in <\(n)>: expected '='", at: p)
            }
            p += 1
            skipSpace()
            guard p < b.count, b[p] == UInt8(ascii: "\"") || b[p] == UInt8(ascii: "'") else {
                throw error("malformed attribute in <\(n)>: expected a quoted value", at: p)
            }
            let quote = b[p]
            var q = p + 1
            while q < b.count && b[q] != quote && b[q] != UInt8(ascii: "<") { q += 1 }
            guard q < b.count, b[q] == quote else {
                throw error("unterminated attribute value in <\(n)>", at: p)
            }
            if let bad = invalidUTF8(p + 1, q) { throw error("invalid UTF-8", at: bad) }
            p = q + 1
        }
    }

    /// Parses `</name>` at p (b[p...] == "</").
    mutating func endTag() throws(PropertyListError) -> String {
        let start = p
        guard let (n, e) = name(at: p + 2) else {
            throw error("malformed end tag \(found(at: start))", at: start)
        }
        p = e
        skipSpace()
        guard p < b.count, b[p] == UInt8(ascii: ">") else {
            throw error("malformed end tag </\(n)", at: start)
        }
        p += 1
        return n
    }

    // MARK: document

    mutating func parseDocument() throws(PropertyListError) -> PropertyListValue {
        if b.count >= 2 && ((b[0] == 0xFE && b[1] == 0xFF) || (b[0] == 0xFF && b[1] == 0xFE)) {
            throw PropertyListError("UTF-16 input is not supported; only UTF-8", line: 1, column: 1)
        }
        if b.count >= 3 && b[0] == 0xEF && b[1] == 0xBB && b[2] == 0xBF {
            bom = 3
            p = 3
        }
        if has("<?xml", at: p), p + 5 < b.count, Self.isSpace(b[p + 5]) || b[p + 5] == UInt8(ascii: "?") {
            try xmlDeclaration()
        }
        try skipMisc(processingInstructions: true)
        if has("<!DOCTYPE", at: p) {
            try doctype()
            try skipMisc(processingInstructions: true)
        }
        guard p < b.count, b[p] == UInt8(ascii: "<"), !has("</", at: p), !has("<!", at: p) else {
            throw error("expected <plist> or a value, found \(found(at: p))", at: p)
        }
        let root = try startTag()
        let value: PropertyListValue
        if root.name == "plist" {
            if root.selfClosing { throw error("empty <plist>", at: root.start) }
            try skipMisc(processingInstructions: false)
            if has("</", at: p) {
                let at = p
                let n = try endTag()
                throw error(n == "plist" ? "empty <plist>" : "expected a value, found </\(n)>", at: at)
            }
            guard p < b.count, b[p] == UInt8(ascii: "<"), !has("<!", at: p) else {
                throw error("expected a value inside <plist>, found \(found(at: p))", at: p)
            }
            let first = try startTag()
            value = try parseValue(first)
            try skipMisc(processingInstructions: false)
            guard has("</", at: p) else {
                throw error(
                    "expected </plist>, found \(found(at: p))"
                        + (p < b.count ? " (a plist holds one value)" : ""), at: p)
            }
            let at = p
            let n = try endTag()
            guard n == "plist" else { throw error("expected </plist>, found </\(n)>", at: at) }
        } else {
            value = try parseValue(root)
        }
        try skipMisc(processingInstructions: true)
        if p < b.count {
            throw error("unexpected \(found(at: p)) after the end of the property list", at: p)
        }
        return value
    }

    mutating func xmlDeclaration() throws(PropertyListError) {
        let start = p
        guard let end = find("?>", from: p + 5) else {
            throw error("unterminated <?xml declaration", at: start)
        }
        // Look for encoding="..."
        var i = p + 5
        while i < end {
            if has("encoding", at: i) {
                var q = i + 8
                while q < end && Self.isSpace(b[q]) { q += 1 }
                if q < end && b[q] == UInt8(ascii: "=") {
                    q += 1
                    while q < end && Self.isSpace(b[q]) { q += 1 }
                    if q < end && (b[q] == UInt8(ascii: "\"") || b[q] == UInt8(ascii: "'")) {
                        let quote = b[q]
                        var r = q + 1
                        while r < end && b[r] != quote { r += 1 }
                        let enc = String(decoding: b[(q + 1)..<r], as: UTF8.self).lowercased()
                        if !["utf-8", "utf8", "us-ascii", "ascii"].contains(enc) {
                            throw error("unsupported encoding \"\(enc)\" (only UTF-8 is read)", at: q + 1)
                        }
                    }
                }
                break
            }
            i += 1
        }
        p = end + 2
    }

    mutating func doctype() throws(PropertyListError) {
        let start = p
        var i = p + 9
        var bracket = 0
        var quote: UInt8 = 0
        while i < b.count {
            let c = b[i]
            if quote != 0 {
                if c == quote { quote = 0 }
            } else if c == UInt8(ascii: "\"") || c == UInt8(ascii: "'") {
                quote = c
            } else if c == UInt8(ascii: "[") {
                bracket += 1
            } else if c == UInt8(ascii: "]") {
                bracket -= 1
            } else if c == UInt8(ascii: ">") && bracket <= 0 {
                p = i + 1
                return
            }
            i += 1
        }
        throw error("unterminated <!DOCTYPE", at: start)
    }

    // MARK: values

    enum Kind { case array, dictionary }

    struct Frame {
        var kind: Kind
        var start: Int
        var items: [PropertyListValue] = []
        var entries: [PropertyListValue.Entry] = []
        var pendingKey: String? = nil
        var seen: [ExactString: Int] = [:]
        var keyStarts: [Int] = []
        var name: String { kind == .array ? "array" : "dict" }
    }

    mutating func count(at pos: Int) throws(PropertyListError) {
        objects += 1
        if objects > limits.maximumObjectCount {
            throw error("more than \(limits.maximumObjectCount) objects", at: pos)
        }
    }

    static func finish(_ frame: Frame) -> PropertyListValue {
        if frame.kind == .array { return .array(frame.items) }
        if frame.entries.count == 1, frame.entries[0].key == "CF$UID",
            case .integer(let n) = frame.entries[0].value, n >= 0, n <= Int128(UInt64.max)
        {
            return .uid(UInt64(n))
        }
        return .dictionary(frame.entries)
    }

    /// Parses one value whose start tag has been read, iteratively.
    mutating func parseValue(_ first: Tag) throws(PropertyListError) -> PropertyListValue {
        var stack: [Frame] = []
        var pending: Tag? = first
        while true {
            let tag: Tag
            if let t = pending {
                tag = t
                pending = nil
            } else {
                // Inside a container: skip whitespace and comments, then a tag must follow.
                try skipMisc(processingInstructions: false)
                guard let top = stack.last else { throw error("internal error", at: p) }
                guard p < b.count else {
                    if let k = top.pendingKey {
                        throw error("unexpected end of input, expected a value for key \"\(k)\"", at: p)
                    }
                    throw error("unexpected end of input, expected </\(top.name)>", at: p)
                }
                guard b[p] == UInt8(ascii: "<") else {
                    throw error("unexpected \(found(at: p)) inside <\(top.name)>", at: p)
                }
                if has("</", at: p) {
                    let at = p
                    let n = try endTag()
                    if let k = top.pendingKey {
                        throw error("expected a value for key \"\(k)\", found </\(n)>", at: at)
                    }
                    guard n == top.name else { throw error("expected </\(top.name)>, found </\(n)>", at: at) }
                    let frame = stack.removeLast()
                    let v = Self.finish(frame)
                    if stack.isEmpty { return v }
                    Self.add(v, to: &stack[stack.count - 1])
                    continue
                }
                if has("<!", at: p) || has("<?", at: p) {
                    throw error("unexpected \(found(at: p)) inside <\(top.name)>", at: p)
                }
                tag = try startTag()
            }

            try count(at: tag.start)
            if tag.name == "key" {
                guard let top = stack.last, top.kind == .dictionary else {
                    throw error("unexpected <key> outside a <dict>", at: tag.start)
                }
                if let k = top.pendingKey {
                    throw error("expected a value for key \"\(k)\", found <key>", at: tag.start)
                }
                let key = try text(tag)
                let fi = stack.count - 1
                var previous: Int? = nil
                if stack[fi].entries.count < 16 {
                    if let i = stack[fi].entries.firstIndex(where: { exactEqual($0.key, key) }) {
                        previous = stack[fi].keyStarts[i]
                    }
                } else {
                    if stack[fi].seen.isEmpty {
                        for (i, e) in stack[fi].entries.enumerated() {
                            stack[fi].seen[ExactString(e.key)] = stack[fi].keyStarts[i]
                        }
                    }
                    previous = stack[fi].seen.updateValue(tag.start, forKey: ExactString(key))
                }
                if let previous {
                    let (l, c) = location(previous)
                    throw error("duplicate key \"\(key)\" (first at line \(l), column \(c))", at: tag.start)
                }
                stack[fi].keyStarts.append(tag.start)
                stack[fi].pendingKey = key
                continue
            }
            if let top = stack.last, top.kind == .dictionary, top.pendingKey == nil {
                throw error("expected <key> or </dict>, found <\(tag.name)>", at: tag.start)
            }
            let value: PropertyListValue
            switch tag.name {
            case "array", "dict":
                let kind: Kind = tag.name == "array" ? .array : .dictionary
                if tag.selfClosing {
                    value = kind == .array ? .array([]) : .dictionary([])
                } else {
                    guard stack.count < limits.maximumDepth else {
                        throw error("nesting deeper than the limit of \(limits.maximumDepth)", at: tag.start)
                    }
                    stack.append(Frame(kind: kind, start: tag.start))
                    continue
                }
            case "string":
                value = .string(try text(tag))
            case "integer":
                value = try integer(tag)
            case "real":
                value = try real(tag)
            case "date":
                value = try date(tag)
            case "data":
                value = try data(tag)
            case "true", "false":
                if !tag.selfClosing {
                    let at = p
                    guard has("</", at: p) else {
                        throw error("expected </\(tag.name)>, found \(found(at: p))", at: p)
                    }
                    let n = try endTag()
                    guard n == tag.name else { throw error("expected </\(tag.name)>, found </\(n)>", at: at) }
                }
                value = .bool(tag.name == "true")
            case "plist":
                throw error("unexpected <plist> inside a property list", at: tag.start)
            default:
                throw error("unknown element <\(tag.name)>", at: tag.start)
            }
            if stack.isEmpty { return value }
            Self.add(value, to: &stack[stack.count - 1])
        }
    }

    static func add(_ v: PropertyListValue, to frame: inout Frame) {
        if frame.kind == .array {
            frame.items.append(v)
        } else if let k = frame.pendingKey {
            frame.entries.append(.init(key: k, value: v))
            frame.pendingKey = nil
        }
    }

    /// Character data of a <string>/<key>-like element up to its end tag: entities, CDATA
    /// sections and comments are handled, any other markup is an error.
    mutating func text(_ tag: Tag) throws(PropertyListError) -> String {
        if tag.selfClosing { return "" }
        // Fast path: plain text straight up to the end tag.
        var run = p
        while run < b.count && b[run] != UInt8(ascii: "<") && b[run] != UInt8(ascii: "&") { run += 1 }
        if has("</", at: run), let (n, e) = name(at: run + 2), n == tag.name, e < b.count,
            b[e] == UInt8(ascii: ">")
        {
            if let bad = invalidUTF8(p, run) { throw error("invalid UTF-8 in <\(tag.name)>", at: bad) }
            let s = String(decoding: b[p..<run], as: UTF8.self)
            p = e + 1
            return s
        }
        var out: [UInt8] = []
        while true {
            var run = p
            while run < b.count && b[run] != UInt8(ascii: "<") && b[run] != UInt8(ascii: "&") { run += 1 }
            if run > p {
                if let bad = invalidUTF8(p, run) { throw error("invalid UTF-8 in <\(tag.name)>", at: bad) }
                out.append(contentsOf: b[p..<run])
                p = run
            }
            guard p < b.count else {
                throw error("unexpected end of input, expected </\(tag.name)>", at: p)
            }
            if b[p] == UInt8(ascii: "&") {
                try entity(into: &out)
            } else if has("<![CDATA[", at: p) {
                guard let end = find("]]>", from: p + 9) else {
                    throw error("unterminated CDATA section", at: p)
                }
                if let bad = invalidUTF8(p + 9, end) {
                    throw error("invalid UTF-8 in <\(tag.name)>", at: bad)
                }
                out.append(contentsOf: b[(p + 9)..<end])
                p = end + 3
            } else if has("<!--", at: p) {
                guard let end = find("-->", from: p + 4) else { throw error("unterminated comment", at: p) }
                p = end + 3
            } else if has("</", at: p) {
                let at = p
                let n = try endTag()
                guard n == tag.name else { throw error("expected </\(tag.name)>, found </\(n)>", at: at) }
                return String(decoding: out, as: UTF8.self)
            } else {
                throw error("expected </\(tag.name)>, found \(found(at: p))", at: p)
            }
        }
    }

    mutating func entity(into out: inout [UInt8]) throws(PropertyListError) {
        let start = p
        var e = p + 1
        while e < b.count && e - p <= 12 && b[e] != UInt8(ascii: ";") && b[e] != UInt8(ascii: "<")
            && !Self.isSpace(b[e])
        { e += 1 }
        guard e < b.count, b[e] == UInt8(ascii: ";") else {
            throw error("'&' not followed by an entity name and ';' (write &amp;)", at: start)
        }
        let name = String(decoding: b[(p + 1)..<e], as: UTF8.self)
        p = e + 1
        switch name {
        case "lt": out.append(UInt8(ascii: "<"))
        case "gt": out.append(UInt8(ascii: ">"))
        case "amp": out.append(UInt8(ascii: "&"))
        case "quot": out.append(UInt8(ascii: "\""))
        case "apos": out.append(UInt8(ascii: "'"))
        default:
            var scalar: UInt32? = nil
            if name.hasPrefix("#x") || name.hasPrefix("#X") {
                let digits = name.dropFirst(2)
                if !digits.isEmpty, digits.allSatisfy(\.isHexDigit) { scalar = UInt32(digits, radix: 16) }
            } else if name.hasPrefix("#") {
                let digits = name.dropFirst()
                if !digits.isEmpty, digits.allSatisfy({ $0.isASCII && $0.isNumber }) {
                    scalar = UInt32(digits)
                }
            } else {
                throw error("unknown entity &\(name);", at: start)
            }
            guard let s = scalar, let u = Unicode.Scalar(s) else {
                throw error("invalid character reference &\(name);", at: start)
            }
            out.append(contentsOf: String(Character(u)).utf8)
        }
    }

    mutating func integer(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        let at = p
        let s = try text(tag)
        guard !s.isEmpty else { throw error("empty <integer>", at: at) }
        var chars = Substring(s)
        var negative = false
        if chars.first == "-" || chars.first == "+" {
            negative = chars.first == "-"
            chars = chars.dropFirst()
        }
        var radix: UInt64 = 10
        if chars.hasPrefix("0x") || chars.hasPrefix("0X") {
            radix = 16
            chars = chars.dropFirst(2)
        }
        var magnitude: UInt64 = 0
        var overflow = false
        guard !chars.isEmpty else { throw error("bad integer \"\(Self.clip(s))\"", at: at) }
        for c in chars.unicodeScalars {
            guard let d = Self.digit(c), d < radix else {
                throw error("bad integer \"\(Self.clip(s))\"", at: at)
            }
            let (m1, o1) = magnitude.multipliedReportingOverflow(by: radix)
            let (m2, o2) = m1.addingReportingOverflow(d)
            if o1 || o2 { overflow = true }
            magnitude = m2
        }
        if overflow || (negative && magnitude > UInt64(1) << 63) {
            throw error("integer \(Self.clip(s)) out of range (Int64.min...UInt64.max)", at: at)
        }
        return .integer(negative ? -Int128(magnitude) : Int128(magnitude))
    }

    static func digit(_ c: Unicode.Scalar) -> UInt64? {
        switch c.value {
        case 0x30...0x39: return UInt64(c.value - 0x30)
        case 0x61...0x66: return UInt64(c.value - 0x61 + 10)
        case 0x41...0x46: return UInt64(c.value - 0x41 + 10)
        default: return nil
        }
    }

    static func clip(_ s: String) -> String { s.count > 40 ? String(s.prefix(40)) + "…" : s }

    /// CF's real syntax: decimal with optional exponent, or inf/infinity/nan (any case, optional sign).
    static func parseReal(_ s: Substring) -> Double? {
        var body = s
        var sign = ""
        if body.first == "-" || body.first == "+" {
            sign = String(body.first ?? "+")
            body = body.dropFirst()
        }
        switch body.lowercased() {
        case "inf", "infinity": return sign == "-" ? -.infinity : .infinity
        case "nan": return .nan
        default: break
        }
        // [digits][.digits][e[+-]digits], at least one digit in the mantissa
        var i = body.startIndex
        var mantissaDigits = 0
        while i < body.endIndex, body[i].isASCII, body[i].isNumber {
            i = body.index(after: i)
            mantissaDigits += 1
        }
        if i < body.endIndex, body[i] == "." {
            i = body.index(after: i)
            while i < body.endIndex, body[i].isASCII, body[i].isNumber {
                i = body.index(after: i)
                mantissaDigits += 1
            }
        }
        guard mantissaDigits > 0 else { return nil }
        if i < body.endIndex, body[i] == "e" || body[i] == "E" {
            i = body.index(after: i)
            if i < body.endIndex, body[i] == "+" || body[i] == "-" { i = body.index(after: i) }
            var expDigits = 0
            while i < body.endIndex, body[i].isASCII, body[i].isNumber {
                i = body.index(after: i)
                expDigits += 1
            }
            guard expDigits > 0 else { return nil }
        }
        guard i == body.endIndex else { return nil }
        return Double(sign + body)
    }

    mutating func real(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        let at = p
        let s = try text(tag)
        // CF (strtod) tolerates leading whitespace.
        let trimmed = s.drop { $0 == " " || $0 == "\t" || $0 == "\n" || $0 == "\r" }
        guard let d = Self.parseReal(trimmed) else {
            throw error(s.isEmpty ? "empty <real>" : "bad real \"\(Self.clip(s))\"", at: at)
        }
        return .real(d)
    }

    mutating func date(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        let at = p
        let s = try text(tag)
        if let t = Self.parseDate(Array(s.utf8)) { return .date(t) }
        // Extension: dates beyond the calendar range are written as seconds.
        if let t = Self.parseReal(Substring(s)), !t.isFinite || t.magnitude >= PlistCalendar.calendarLimit {
            return .date(t)
        }
        throw error("bad date \"\(Self.clip(s))\" (expected YYYY-MM-DDTHH:MM:SSZ)", at: at)
    }

    /// YYYY-MM-DDTHH:MM:SS[.fraction]Z, proleptic Gregorian, year may be negative or longer.
    static func parseDate(_ c: [UInt8]) -> Double? {
        var i = 0
        func digits(_ min: Int, _ max: Int) -> Int64? {
            var v: Int64 = 0
            var n = 0
            while i < c.count, c[i] >= 0x30, c[i] <= 0x39, n < max {
                v = v * 10 + Int64(c[i] - 0x30)
                i += 1
                n += 1
            }
            if i < c.count, c[i] >= 0x30, c[i] <= 0x39 { return nil }
            return n >= min ? v : nil
        }
        func expect(_ ch: Character) -> Bool {
            guard i < c.count, c[i] == ch.asciiValue else { return false }
            i += 1
            return true
        }
        var negative = false
        if i < c.count, c[i] == UInt8(ascii: "-") {
            negative = true
            i += 1
        }
        guard let y0 = digits(negative ? 3 : 4, 11) else { return nil }
        let year = negative ? -y0 : y0
        guard expect("-"), let month = digits(2, 2), expect("-"), let day = digits(2, 2), expect("T"),
            let hour = digits(2, 2), expect(":"), let minute = digits(2, 2), expect(":"),
            let second = digits(2, 2)
        else { return nil }
        var fraction = ""
        if i < c.count, c[i] == UInt8(ascii: ".") {
            i += 1
            let s = i
            while i < c.count, c[i] >= 0x30, c[i] <= 0x39 { i += 1 }
            // The writer's shortest exact fraction of a Double has at most 17 significant digits
            // after up to 324 zeros (the smallest subnormal); longer is not a date we wrote.
            guard i > s, i - s <= 400 else { return nil }
            fraction = String(decoding: c[s..<i], as: UTF8.self)
        }
        guard expect("Z"), i == c.count else { return nil }
        guard (1...12).contains(month), day >= 1,
            day <= Int64(PlistCalendar.daysIn(month: Int(month), year: year)),
            hour <= 23, minute <= 59, second <= 59
        else { return nil }
        let days =
            PlistCalendar.days(year: year, month: Int(month), day: Int(day)) - PlistCalendar.referenceDay
        let (ds, o) = days.multipliedReportingOverflow(by: 86400)
        guard !o else { return nil }
        let (w, o2) = ds.addingReportingOverflow(hour * 3600 + minute * 60 + second)
        guard !o2 else { return nil }
        return PlistCalendar.seconds(whole: w, fraction: fraction)
    }

    mutating func data(_ tag: Tag) throws(PropertyListError) -> PropertyListValue {
        if tag.selfClosing { return .data(Data()) }
        let contentStart = p
        var sextets: [UInt8] = []
        var padding = 0
        while p < b.count && b[p] != UInt8(ascii: "<") {
            let c = b[p]
            if Self.isSpace(c) {
                p += 1
                continue
            }
            if c == UInt8(ascii: "=") {
                padding += 1
                if padding > 2 { throw error("too much '=' padding in <data>", at: p) }
                p += 1
                continue
            }
            guard let v = Self.base64Value(c) else {
                var e = p + 1
                while e < b.count && b[e] & 0xC0 == 0x80 { e += 1 }
                throw error(
                    "invalid character '\(String(decoding: b[p..<e], as: UTF8.self))' in <data>", at: p)
            }
            if padding > 0 { throw error("base64 character after '=' padding in <data>", at: p) }
            sextets.append(v)
            p += 1
        }
        guard p < b.count else { throw error("unexpected end of input, expected </data>", at: p) }
        guard has("</", at: p) else { throw error("expected </data>, found \(found(at: p))", at: p) }
        let endAt = p
        let n = try endTag()
        guard n == "data" else { throw error("expected </data>, found </\(n)>", at: endAt) }
        let total = sextets.count + padding
        guard total % 4 == 0, padding == 0 || sextets.count % 4 == 4 - padding else {
            throw error(
                "base64 in <data> has \(total) characters; expected a multiple of 4", at: contentStart)
        }
        var out = [UInt8]()
        out.reserveCapacity(sextets.count * 3 / 4)
        var i = 0
        while i + 4 <= sextets.count {
            let v =
                UInt32(sextets[i]) << 18 | UInt32(sextets[i + 1]) << 12 | UInt32(sextets[i + 2]) << 6
                | UInt32(sextets[i + 3])
            out.append(UInt8(truncatingIfNeeded: v >> 16))
            out.append(UInt8(truncatingIfNeeded: v >> 8))
            out.append(UInt8(truncatingIfNeeded: v))
            i += 4
        }
        let rest = sextets.count - i
        if rest == 2 {
            out.append(sextets[i] << 2 | sextets[i + 1] >> 4)
        } else if rest == 3 {
            out.append(sextets[i] << 2 | sextets[i + 1] >> 4)
            out.append((sextets[i + 1] & 0x0F) << 4 | sextets[i + 2] >> 2)
        }
        return .data(Data(out))
    }

    static func base64Value(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x41...0x5A: return c - 0x41
        case 0x61...0x7A: return c - 0x61 + 26
        case 0x30...0x39: return c - 0x30 + 52
        case UInt8(ascii: "+"): return 62
        case UInt8(ascii: "/"): return 63
        default: return nil
        }
    }
}

// MARK: - describe

enum Describer {
    static func quoted(_ s: String) -> String {
        var out = "\""
        for u in s.unicodeScalars {
            switch u {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            default:
                if u.value < 0x20 || u.value == 0x7F {
                    out += "\\u{" + String(u.value, radix: 16) + "}"
                } else {
                    out.unicodeScalars.append(u)
                }
            }
        }
        return out + "\""
    }

    static func hexBytes<S: Sequence>(_ bytes: S) -> String where S.Element == UInt8 {
        var s = ""
        for byte in bytes {
            s += byte < 16 ? "0" + String(byte, radix: 16) : String(byte, radix: 16)
        }
        return s
    }

    static func dateText(_ t: Double) -> String {
        guard t.isFinite, t.magnitude < PlistCalendar.calendarLimit else {
            return "date(\(t) s since 2001-01-01)"
        }
        let p = PlistCalendar.parts(t)
        func two(_ v: Int) -> String { v < 10 ? "0\(v)" : "\(v)" }
        return PlistCalendar.yearText(p.year) + "-" + two(p.month) + "-" + two(p.day) + " " + two(p.hour)
            + ":"
            + two(p.minute) + ":" + two(p.second) + (p.fraction.isEmpty ? "" : "." + p.fraction) + " +0000"
    }

    static func describe(_ v: PropertyListValue, level: Int, into out: inout String) {
        let pad = String(repeating: "  ", count: level + 1)
        let closePad = String(repeating: "  ", count: level)
        switch v {
        case .string(let s): out += quoted(s)
        case .integer(let i): out += String(i)
        case .real(let d): out += d.description
        case .bool(let b): out += b ? "true" : "false"
        case .date(let t): out += dateText(t)
        case .data(let d):
            if d.count <= 32 {
                out += "{length = \(d.count), bytes = 0x\(hexBytes(d))}"
            } else {
                out +=
                    "{length = \(d.count), bytes = 0x\(hexBytes(d.prefix(16))) ... \(hexBytes(d.suffix(8)))}"
            }
        case .uid(let u): out += "<CFKeyedArchiverUID>{value = \(u)}"
        case .array(let items):
            if items.isEmpty {
                out += "[]"
                return
            }
            out += "[\n"
            for (i, item) in items.enumerated() {
                out += pad + "\(i) => "
                describe(item, level: level + 1, into: &out)
                out += "\n"
            }
            out += closePad + "]"
        case .dictionary(let entries):
            if entries.isEmpty {
                out += "{}"
                return
            }
            out += "{\n"
            for e in entries {
                out += pad + quoted(e.key) + " => "
                describe(e.value, level: level + 1, into: &out)
                out += "\n"
            }
            out += closePad + "}"
        }
    }
}
