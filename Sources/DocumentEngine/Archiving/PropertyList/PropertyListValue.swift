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
    /// writers write what they are given, so a value outside it does not read back.
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

// MARK: - Exact strings

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
