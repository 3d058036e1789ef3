// PropertyListTests.swift — tests for PropertyList.swift (swift-testing).
//
// harness.swift is generated from this file by gen_harness.py (macros → functions),
// so the two check exactly the same things.

import Foundation
import TestSupport
import Testing

@testable import DocumentEngine

// MARK: - Helpers

/// Runs `body` and returns the PropertyListError it threw, or nil if it returned.
/// (Closures don't infer typed throws, so `body` is untyped; the decoders only throw PropertyListError.)
private func plistFailure(_ body: () throws -> PropertyListValue) -> PropertyListError? {
    do {
        _ = try body()
        return nil
    } catch let error as PropertyListError {
        return error
    } catch {
        return PropertyListError("unexpected error type: \(error)")
    }
}

private func hexBytes(_ s: String) -> [UInt8] {
    let digits = Array(s.unicodeScalars.filter { $0.properties.isASCIIHexDigit })
    var out: [UInt8] = []
    var i = 0
    while i + 1 < digits.count {
        out.append(UInt8(String(digits[i]) + String(digits[i + 1]), radix: 16) ?? 0)
        i += 2
    }
    return out
}

private func be(_ v: UInt64, _ size: Int) -> [UInt8] {
    (0..<size).reversed().map { UInt8(truncatingIfNeeded: v >> UInt64($0 * 8)) }
}

/// A bplist00 file holding `objects` (raw object bytes, object i at index i).
private func bplist(_ objects: [[UInt8]], top: Int = 0, refSize: Int = 1, offsetSize: Int? = nil) -> Data {
    var out = Array("bplist00".utf8)
    var offsets: [Int] = []
    for o in objects {
        offsets.append(out.count)
        out += o
    }
    let table = out.count
    let osize = offsetSize ?? (table < 256 ? 1 : table < 65536 ? 2 : 4)
    for o in offsets { out += be(UInt64(o), osize) }
    out += [0, 0, 0, 0, 0, 0, UInt8(osize), UInt8(refSize)]
    out += be(UInt64(objects.count), 8) + be(UInt64(top), 8) + be(UInt64(table), 8)
    return Data(out)
}

private struct Trailer {
    var offsetSize: Int, refSize: Int, count: Int, top: Int, tableOffset: Int
}

private func trailer(_ d: Data) -> Trailer {
    let b = [UInt8](d.suffix(32))
    func read(_ at: Int) -> Int { b[at..<(at + 8)].reduce(0) { $0 << 8 | Int($1) } }
    return Trailer(
        offsetSize: Int(b[6]), refSize: Int(b[7]), count: read(8), top: read(16), tableOffset: read(24))
}

/// The bytes of the objects of an encoded plist (between header and offset table).
private func objectBytes(_ d: Data) -> [UInt8] {
    let t = trailer(d)
    return Array([UInt8](d)[8..<t.tableOffset])
}

private func xmlDoc(_ body: String) -> Data {
    Data(("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\">\n" + body + "</plist>\n").utf8)
}

private func corelibsBinary(_ p: Any) throws -> Data {
    try PropertyListSerialization.data(fromPropertyList: p, format: .binary, options: 0)
}

private func corelibsXML(_ p: Any) throws -> Data {
    try PropertyListSerialization.data(fromPropertyList: p, format: .xml, options: 0)
}

extension SplitMix64 {
    fileprivate mutating func below(_ n: Int) -> Int { Int(next() % UInt64(n)) }
}

/// A value using every type, including ones that need count extensions and UTF-16.
/// `cfReadable` leaves out the UID above UInt32.max, which CF cannot read (its UIDs are 32-bit).
private func richValue(cfReadable: Bool = false) -> PropertyListValue {
    let bigUID: [PropertyListValue] = cfReadable ? [] : [.uid(UInt64(UInt32.max) + 1)]
    let many: [PropertyListValue] = (0..<20).map { .string("item \($0)") }
    return [
        "string": "hello <&> world",
        "empty string": "",
        "unicode": "héllo wörld 日本語 😀👍🏽",
        "ints": [
            0, 1, 255, 256, 65535, 65536, 4_294_967_295, 4_294_967_296, -1, -129,
            .integer(Int128(Int64.min)), .integer(Int128(Int64.max)), .integer(Int128(UInt64.max)),
        ],
        "reals": [
            0.0, 1.5, -2.25, 1.1, 1e300, .real(.leastNonzeroMagnitude), .real(.infinity), .real(-.infinity),
        ],
        "bools": [true, false, true],
        "dates": [.date(0), .date(700_000_000), .date(1.25), .date(-0.75), .date(-1e11)],
        "data": .data(Data([0, 1, 2, 254, 255])),
        "long data": .data(Data((0..<100).map { UInt8($0) })),
        "empty data": .data(Data()),
        "many": .array(many),
        "empty array": [],
        "empty dict": [:],
        "nested": ["a": ["b": ["c": [1, [2, [3]]]]]],
        "uids": .array([.uid(0), .uid(255), .uid(256), .uid(70000)] + bigUID),
        "long string": .string(String(repeating: "abcdefghij", count: 5)),
    ]
}

// MARK: - Tests

@Suite struct PropertyListTests {

    // MARK: types and round trips

    @Test func everyTypeRoundTrips() throws {
        let v = richValue()
        let bin = PropertyList.encodeBinary(v)
        #expect(PropertyList.isBinary(bin))
        #expect(try PropertyList.decodeBinary(bin) == v)
        let xml = PropertyList.encodeXML(v)
        #expect(!PropertyList.isBinary(xml))
        #expect(try PropertyList.decodeXML(xml) == v)
        #expect(try PropertyList.decode(bin) == v)
        #expect(try PropertyList.decode(xml) == v)
        for scalar: PropertyListValue in ["s", 7, 2.5, true, .date(3), .data(Data([1])), .uid(9)] {
            #expect(try PropertyList.decodeBinary(PropertyList.encodeBinary(scalar)) == scalar)
            #expect(try PropertyList.decodeXML(PropertyList.encodeXML(scalar)) == scalar)
        }
    }

    @Test func binaryToXMLToBinary() throws {
        let v = richValue()
        let b1 = PropertyList.encodeBinary(v)
        let v1 = try PropertyList.decodeBinary(b1)
        let x = PropertyList.encodeXML(v1)
        let v2 = try PropertyList.decodeXML(x)
        #expect(v2 == v)
        #expect(PropertyList.encodeBinary(v2) == b1)
        #expect(PropertyList.encodeXML(v2) == x)
    }

    @Test func binaryIntegerWidths() throws {
        let cases: [(String, Int128)] = [
            ("10 7f", 127),
            ("10 ff", 255),
            ("11 ff ff", 65535),
            ("12 ff ff ff ff", 4_294_967_295),
            ("13 ff ff ff ff ff ff ff ff", -1),
            ("13 80 00 00 00 00 00 00 00", Int128(Int64.min)),
            ("13 7f ff ff ff ff ff ff ff", Int128(Int64.max)),
            ("14 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff", Int128(UInt64.max)),
            ("14 ff ff ff ff ff ff ff ff 80 00 00 00 00 00 00 00", Int128(Int64.min)),
            ("14 ff ff ff ff ff ff ff ff ff ff ff ff ff ff ff fe", -2),
        ]
        for (hex, expected) in cases {
            #expect(try PropertyList.decodeBinary(bplist([hexBytes(hex)])) == .integer(expected), "\(hex)")
        }
        // 128-bit values outside Int64.min...UInt64.max, and unsupported widths
        for hex in [
            "14 00 00 00 00 00 00 00 01 00 00 00 00 00 00 00 00",
            "14 ff ff ff ff ff ff ff fe ff ff ff ff ff ff ff ff",
            "15 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 01",
        ] {
            #expect(plistFailure { try PropertyList.decodeBinary(bplist([hexBytes(hex)])) } != nil, "\(hex)")
        }
        // Writer widths (CF's _appendInt / SInt128 rule)
        let widths: [(Int128, String)] = [
            (0, "10 00"), (255, "10 ff"), (256, "11 01 00"), (65535, "11 ff ff"), (65536, "12 00 01 00 00"),
            (4_294_967_295, "12 ff ff ff ff"), (4_294_967_296, "13 00 00 00 01 00 00 00 00"),
            (-1, "13 ff ff ff ff ff ff ff ff"), (Int128(Int64.min), "13 80 00 00 00 00 00 00 00"),
            (Int128(Int64.max), "13 7f ff ff ff ff ff ff ff"),
            (Int128(Int64.max) + 1, "14 00 00 00 00 00 00 00 00 80 00 00 00 00 00 00 00"),
            (Int128(UInt64.max), "14 00 00 00 00 00 00 00 00 ff ff ff ff ff ff ff ff"),
        ]
        for (v, hex) in widths {
            #expect(objectBytes(PropertyList.encodeBinary(.integer(v))) == hexBytes(hex), "\(v)")
        }
    }

    @Test func binaryReals() throws {
        #expect(try PropertyList.decodeBinary(bplist([hexBytes("22 3f c0 00 00")])) == .real(1.5))
        #expect(
            try PropertyList.decodeBinary(bplist([hexBytes("22 3d cc cc cd")])) == .real(Double(Float(0.1))))
        #expect(try PropertyList.decodeBinary(bplist([hexBytes("23 3f f1 99 99 99 99 99 9a")])) == .real(1.1))
        #expect(
            try PropertyList.decodeBinary(bplist([hexBytes("23 7f f8 00 00 00 00 00 01")]))
                == .real(Double(bitPattern: 0x7FF8_0000_0000_0001)))
        #expect(plistFailure { try PropertyList.decodeBinary(bplist([hexBytes("21 3c 00")])) } != nil)
        #expect(
            plistFailure {
                try PropertyList.decodeBinary(
                    bplist([hexBytes("24 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00")]))
            } != nil)
        #expect(objectBytes(PropertyList.encodeBinary(.real(1.5))) == hexBytes("23 3f f8 00 00 00 00 00 00"))
        #expect(objectBytes(PropertyList.encodeBinary(.real(-0.0))) == hexBytes("23 80 00 00 00 00 00 00 00"))
    }

    @Test func dates() throws {
        #expect(
            try PropertyList.decodeBinary(bplist([hexBytes("33 41 c4 dc 93 80 00 00 00")]))
                == .date(700_000_000))
        #expect(plistFailure { try PropertyList.decodeBinary(bplist([hexBytes("32 00 00 00 00")])) } != nil)
        #expect(objectBytes(PropertyList.encodeBinary(.date(1.25))) == hexBytes("33 3f f4 00 00 00 00 00 00"))
        let texts: [(Double, String)] = [
            (0, "2001-01-01T00:00:00Z"),
            (1.25, "2001-01-01T00:00:01.25Z"),
            (0.1, "2001-01-01T00:00:00.1Z"),
            (-0.75, "2000-12-31T23:59:59.25Z"),
            (-1, "2000-12-31T23:59:59Z"),
            (817_308_131, "2026-11-25T14:02:11Z"),
            (817_308_131.5, "2026-11-25T14:02:11.5Z"),
            (-63_113_904_000, "0001-01-01T00:00:00Z"),
            (-63_114_076_800, "0000-12-30T00:00:00Z"),
            (-1e11, "-1168-02-16T14:13:20Z"),
            (252_423_993_600, "10000-01-01T00:00:00Z"),
            (1e-7, "2001-01-01T00:00:00.0000001Z"),
        ]
        for (t, text) in texts {
            let xml = String(decoding: PropertyList.encodeXML(.date(t)), as: UTF8.self)
            #expect(xml.contains("<date>\(text)</date>"), "\(t): \(xml)")
            #expect(try PropertyList.decodeXML(xmlDoc("<date>\(text)</date>\n")) == .date(t), "\(text)")
        }
        // Fractions are exact: random doubles survive XML unchanged.
        var rng = SplitMix64(seed: 42)
        for _ in 0..<3000 {
            let t = (Double(rng.next() % 2_000_000_000_000) - 1_000_000_000_000) / Double(1 << rng.below(40))
            #expect(try PropertyList.decodeXML(PropertyList.encodeXML(.date(t))) == .date(t), "\(t)")
        }
        // Outside the calendar range: written as seconds (extension), still exact.
        for t in [Double.nan, .infinity, -.infinity, 1e300, -4e18] {
            #expect(try PropertyList.decodeXML(PropertyList.encodeXML(.date(t))) == .date(t), "\(t)")
        }
    }

    @Test func countExtension() throws {
        for n in [0, 1, 14, 15, 16, 255, 256, 300] {
            let arr = PropertyListValue.array((0..<n).map { .integer(Int128($0 + 1000)) })
            let dict = PropertyListValue.dictionary((0..<n).map { .init("k\($0)", .integer(Int128($0))) })
            let str = PropertyListValue.string(String(repeating: "x", count: n))
            let ustr = PropertyListValue.string(String(repeating: "é", count: n))
            let data = PropertyListValue.data(Data(repeating: 7, count: n))
            for v in [arr, dict, str, ustr, data] {
                #expect(try PropertyList.decodeBinary(PropertyList.encodeBinary(v)) == v)
                #expect(try PropertyList.decodeXML(PropertyList.encodeXML(v)) == v)
            }
        }
        #expect(
            objectBytes(PropertyList.encodeBinary(.string(String(repeating: "x", count: 15)))).prefix(3) == [
                0x5F, 0x10, 0x0F,
            ])
        #expect(
            objectBytes(PropertyList.encodeBinary(.string(String(repeating: "x", count: 14)))).prefix(1) == [
                0x5E
            ])
        #expect(
            objectBytes(PropertyList.encodeBinary(.data(Data(count: 300)))).prefix(4) == [
                0x4F, 0x11, 0x01, 0x2C,
            ])
        #expect(
            objectBytes(PropertyList.encodeBinary(.array(Array(repeating: true, count: 15)))).prefix(3) == [
                0xAF, 0x10, 0x0F,
            ])
        // hand-made: count given by an integer object, even when not needed
        #expect(try PropertyList.decodeBinary(bplist([hexBytes("5f 10 03 61 62 63")])) == "abc")
        #expect(
            try PropertyList.decodeBinary(bplist([hexBytes("4f 11 00 02 01 02")])) == .data(Data([1, 2])))
        // a count that is not an integer object
        #expect(plistFailure { try PropertyList.decodeBinary(bplist([hexBytes("5f 51 61 61")])) } != nil)
    }

    @Test func unicodeStrings() throws {
        #expect(objectBytes(PropertyList.encodeBinary("é")) == hexBytes("61 00 e9"))
        #expect(objectBytes(PropertyList.encodeBinary("😀")) == hexBytes("62 d8 3d de 00"))
        #expect(objectBytes(PropertyList.encodeBinary("a")) == hexBytes("51 61"))
        #expect(try PropertyList.decodeBinary(bplist([hexBytes("62 d8 3d de 00")])) == "😀")
        #expect(try PropertyList.decodeBinary(bplist([hexBytes("63 00 41 00 00 30 42")])) == "A\u{0}\u{3042}")
        // unpaired surrogates and non-ASCII bytes in ASCII strings are errors, not replaced
        for hex in ["61 d8 3d", "61 de 00", "62 d8 3d 00 41", "62 de 00 d8 3d", "51 e9"] {
            #expect(plistFailure { try PropertyList.decodeBinary(bplist([hexBytes(hex)])) } != nil, "\(hex)")
        }
        // canonically equivalent strings stay distinct objects and values
        let v: PropertyListValue = ["\u{E9}", "e\u{301}"]
        #expect(v != ["\u{E9}", "\u{E9}"])
        let bin = PropertyList.encodeBinary(v)
        #expect(trailer(bin).count == 3)
        #expect(try PropertyList.decodeBinary(bin) == v)
        #expect(try PropertyList.decodeXML(PropertyList.encodeXML(v)) == v)
        let astral: PropertyListValue = ["key 🔑": "𝄞 music 🎵 \u{10FFFF}"]
        #expect(try PropertyList.decodeBinary(PropertyList.encodeBinary(astral)) == astral)
        #expect(try PropertyList.decodeXML(PropertyList.encodeXML(astral)) == astral)
    }

    @Test func nestedContainers() throws {
        var v: PropertyListValue = "leaf"
        for i in 0..<30 {
            v = i % 2 == 0 ? ["level \(i)": v, "n": .integer(Int128(i))] : [v, .integer(Int128(i)), []]
        }
        #expect(try PropertyList.decodeBinary(PropertyList.encodeBinary(v)) == v)
        #expect(try PropertyList.decodeXML(PropertyList.encodeXML(v)) == v)
        // the same array reached twice (a DAG) decodes to equal copies
        let shared = bplist([hexBytes("a2 01 01"), hexBytes("a1 02"), hexBytes("51 78")])
        #expect(try PropertyList.decodeBinary(shared) == [["x"], ["x"]])
    }

    @Test func uidWidths() throws {
        let cases: [(String, UInt64)] = [
            ("80 05", 5), ("81 01 00", 256), ("82 01 00 00", 65536), ("83 ff ff ff ff", 4_294_967_295),
            ("87 ff ff ff ff ff ff ff ff", UInt64.max),
            ("8f 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 07", 7),
        ]
        for (hex, expected) in cases {
            #expect(try PropertyList.decodeBinary(bplist([hexBytes(hex)])) == .uid(expected), "\(hex)")
        }
        #expect(
            plistFailure {
                try PropertyList.decodeBinary(bplist([hexBytes("88 01 00 00 00 00 00 00 00 00")]))
            } != nil)
        let widths: [(UInt64, String)] = [
            (0, "80 00"), (255, "80 ff"), (256, "81 01 00"), (65536, "83 00 01 00 00"),
            (4_294_967_296, "87 00 00 00 01 00 00 00 00"),
        ]
        for (u, hex) in widths {
            #expect(objectBytes(PropertyList.encodeBinary(.uid(u))) == hexBytes(hex), "\(u)")
        }
        let xml = String(decoding: PropertyList.encodeXML(["$top": .uid(3)]), as: UTF8.self)
        #expect(
            xml.contains(
                "\t<key>$top</key>\n\t<dict>\n\t\t<key>CF$UID</key>\n\t\t<integer>3</integer>\n\t</dict>\n"))
        #expect(try PropertyList.decodeXML(Data(xml.utf8)) == ["$top": .uid(3)])
    }

    @Test func writerLayout() throws {
        // 300 distinct strings: 301 objects need 2-byte references (CF's _byteCount of the object count)
        let strings = PropertyListValue.array((0..<300).map { .string("s\($0)") })
        let t1 = trailer(PropertyList.encodeBinary(strings))
        #expect(t1.refSize == 2 && t1.count == 301 && t1.offsetSize == 2 && t1.top == 0)
        // offsets past 65535 need 4-byte offset integers
        let big = PropertyListValue.array([.data(Data(count: 70000)), "after"])
        #expect(trailer(PropertyList.encodeBinary(big)).offsetSize == 4)
        // uniquing by value: equal leaves are shared, containers never
        let dup: PropertyListValue = [
            "a", "a", 1000, 1000, 2.5, 2.5, .data(Data([1])), .data(Data([1])), .uid(4), .uid(4), ["x"],
            ["x"],
        ]
        let bin = PropertyList.encodeBinary(dup)
        #expect(trailer(bin).count == 1 + 5 + 2 + 1)
        #expect(try PropertyList.decodeBinary(bin) == dup)
        // booleans follow CF: one object per occurrence, references to the first
        let bools = PropertyList.encodeBinary([true, true, false])
        #expect(objectBytes(bools) == hexBytes("a3 01 01 03 09 09 08"))
        // dictionary: the object, all keys, then all values
        let dictBin = PropertyList.encodeBinary(["k": "v", "j": ["w"]])
        #expect(objectBytes(dictBin) == hexBytes("d2 01 02 03 04 51 6b 51 6a 51 76 a1 05 51 77"))
    }

    // MARK: compatibility with swift-corelibs-foundation

    /// Plists with no repeated leaf values (other than booleans): CF's identity-based
    /// sharing and our value-based sharing agree, so the bytes must be identical.
    fileprivate static func distinctSamples() -> [Any] {
        [
            [
                "name": "DocFS", "version": 3, "pi": 3.25, "ok": true,
                "when": Date(timeIntervalSinceReferenceDate: 700_000_000),
                "blob": Data([1, 2, 3]), "list": ["x", "y", 42, -7], "nested": ["inner": ["deep": "yes"]],
                "empty": [String](), "emptyDict": [String: Any](), "big": UInt64.max, "neg": Int64.min,
                "uni": "héllo 😀", "flags": [true, false, true, true],
            ] as [String: Any],
            (0..<20).map { "string number \($0)" } + ["tail"],
            Dictionary(uniqueKeysWithValues: (0..<16).map { ("key\($0)", $0 * 1000) }),
            (0..<300).map { "s\($0)" },
            [Data(repeating: 0xAB, count: 70000), "after the data"] as [Any],
            "just a string",
            42,
            [["a": [["b": [1.5, -2.5]]]]],
            [Int64.max, Int64.min, -1, 65536, 4_294_967_296, UInt64(Int64.max) + 1] as [Any],
        ]
    }

    /// Plists with repeated values, and keyed archives.
    fileprivate static func repeatedSamples() throws -> [Data] {
        var out: [Data] = []
        out.append(
            try corelibsBinary(
                [
                    "a", "a", 1000, 1000, 1, 1, -1, -1, 2.5, 2.5, 0.0, 0.0, 1.0, 1.0, Double.nan, Double.nan,
                    Data([1]), Data([1]), Date(timeIntervalSinceReferenceDate: 5),
                    Date(timeIntervalSinceReferenceDate: 5),
                    ["k": "k", "l": 12, "m": 12, "n": 13, "o": 13],
                ] as [Any]))
        let ka = NSKeyedArchiver(requiringSecureCoding: false)
        ka.encode("hello", forKey: "greeting")
        ka.encode(42, forKey: "answer")
        ka.encode(["a", "b", "a"] as NSArray, forKey: "list")
        ka.encode(["x": 1, "y": 2] as NSDictionary, forKey: "dict")
        ka.finishEncoding()
        out.append(ka.encodedData)
        let kb = NSKeyedArchiver(requiringSecureCoding: false)
        kb.encode(["s": "t"] as NSDictionary, forKey: "d")
        kb.encode(Date(timeIntervalSinceReferenceDate: 12345), forKey: "when")
        kb.encode(Data([9, 8, 7]), forKey: "blob")
        kb.encode(3.25, forKey: "real")
        kb.encode(Int64.min, forKey: "min")
        kb.encode(["x", "y", "x", 1000, 1000, "s", "s"] as NSArray, forKey: "xs")
        kb.encode(true, forKey: "b1")
        kb.encode(true, forKey: "b2")
        kb.finishEncoding()
        out.append(kb.encodedData)
        return out
    }

    @Test func binaryMatchesCorelibs() throws {
        for sample in Self.distinctSamples() {
            let x = try corelibsBinary(sample)
            let v = try PropertyList.decodeBinary(x)
            #expect(PropertyList.encodeBinary(v) == x, "\(PropertyList.describe(v).prefix(200))")
            #expect(PropertyList.encodeBinary(v, uniquing: .corelibs) == x)
        }
        for x in try Self.repeatedSamples() {
            let v = try PropertyList.decodeBinary(x)
            #expect(
                PropertyList.encodeBinary(v, uniquing: .corelibs) == x,
                "\(PropertyList.describe(v).prefix(300))")
            // value uniquing never writes more objects than CF, and decodes to the same value
            let compact = PropertyList.encodeBinary(v)
            #expect(trailer(compact).count <= trailer(x).count)
            #expect(try PropertyList.decodeBinary(compact) == v)
        }
        // corelibs reads what we write (binary and XML)
        let ours = PropertyList.encodeBinary(richValue(cfReadable: true))
        #expect((try? PropertyListSerialization.propertyList(from: ours, format: nil)) != nil)
        let oursXML = PropertyList.encodeXML(richValue(cfReadable: true), dropDateFractions: true)
        #expect((try? PropertyListSerialization.propertyList(from: oursXML, format: nil)) != nil)
        // without dropDateFractions the fraction is kept (CF cannot read that form)
        let fractional = String(decoding: PropertyList.encodeXML(.date(-0.75)), as: UTF8.self)
        #expect(fractional.contains("<date>2000-12-31T23:59:59.25Z</date>"))
        let dropped = String(
            decoding: PropertyList.encodeXML(.date(-0.75), dropDateFractions: true), as: UTF8.self)
        #expect(dropped.contains("<date>2000-12-31T23:59:59Z</date>"))
    }

    @Test func xmlMatchesCorelibs() throws {
        var samples = Self.distinctSamples()
        samples.append(
            [
                "deep": [[[[[[[[[[[Data(repeating: 7, count: 100)]]]]]]]]]]],
                "top": Data(repeating: 9, count: 200),
                "d1": [Data(repeating: 1, count: 57)], "chars": "<tag> & \"quotes\" 'apos' ]]> \t tab",
                "dates": [
                    Date(timeIntervalSinceReferenceDate: -1e11), Date(timeIntervalSinceReferenceDate: 3e11),
                    Date(timeIntervalSinceReferenceDate: -63_114_076_800),
                ],
            ] as [String: Any])
        samples.append([
            // Not -0.0: corelibs writes it as 0.0, losing the sign; we keep it (below).
            1.0, 0.0, Double.infinity, -Double.infinity, Double.nan, 1.1, 1e300, 0.1, 123456789.0,
            1e16, 1e17, Double.leastNonzeroMagnitude, 100.0, 1.5e-7, 2.2250738585072014e-308,
            1.7976931348623157e308, 0.3,
        ])
        samples.append(Data())
        samples.append([String: Any]())
        samples.append([Any]())
        for sample in samples {
            let cx = try corelibsXML(sample)
            #expect(
                PropertyList.encodeXML(try PropertyList.decodeXML(cx)) == cx,
                "\(String(decoding: cx, as: UTF8.self).prefix(300))")
            let fromBinary = try PropertyList.decodeBinary(try corelibsBinary(sample)).sortedKeys()
            #expect(PropertyList.encodeXML(fromBinary) == cx)
        }
    }

    @Test func realTextMatchesCorelibs() throws {
        var rng = SplitMix64(seed: 7)
        var reals: [Double] = []
        for i in 0..<3000 {
            switch i % 3 {
            case 0: reals.append(Double(bitPattern: rng.next()))
            case 1: reals.append(Double(rng.below(1_000_000)) / Double(rng.below(999) + 1))
            default:
                reals.append(
                    Double(
                        sign: .plus, exponent: rng.below(200) - 100,
                        significand: 1 + Double(rng.below(1000)) / 1000))
            }
        }
        let cx = try corelibsXML(reals)
        #expect(PropertyList.encodeXML(.array(reals.map { .real($0) })) == cx)
        let xml = String(
            decoding: PropertyList.encodeXML([
                1.1, 1e300, 1.0, -0.0, .real(.infinity), .real(-.infinity), .real(.nan), 1e17, 0.1,
            ]), as: UTF8.self)
        #expect(
            xml.contains(
                "<real>1.1000000000000001</real>\n\t<real>1.0000000000000001e+300</real>\n\t<real>1</real>\n\t<real>-0.0</real>\n\t<real>+infinity</real>\n\t<real>-infinity</real>\n\t<real>nan</real>\n\t<real>1e+17</real>\n\t<real>0.10000000000000001</real>"
            ))
        // reading the text back gives the same double, the sign of a zero included (found by
        // the fuzzer: CF's "0.0" for -0.0 changed the value)
        #expect(try PropertyList.decodeXML(PropertyList.encodeXML(.real(-0.0))) == .real(-0.0))
        for r in reals where !r.isNaN {
            #expect(try PropertyList.decodeXML(PropertyList.encodeXML(.real(r))) == .real(r))
        }
    }

    @Test func wholeSecondDatesMatchCorelibs() throws {
        var rng = SplitMix64(seed: 99)
        var dates: [Date] = []
        for _ in 0..<500 {
            dates.append(
                Date(
                    timeIntervalSinceReferenceDate: Double(
                        Int64(rng.next() % 200_000_000_000) - 100_000_000_000)))
        }
        let cx = try corelibsXML(dates)
        #expect(PropertyList.encodeXML(.array(dates.map { .date($0.timeIntervalSinceReferenceDate) })) == cx)
        #expect(
            try PropertyList.decodeXML(cx) == .array(dates.map { .date($0.timeIntervalSinceReferenceDate) }))
    }

    // MARK: hostile binary input

    @Test func truncatedFilesThrow() throws {
        let full = PropertyList.encodeBinary(richValue())
        for n in 0..<full.count {
            #expect(plistFailure { try PropertyList.decodeBinary(full.prefix(n)) } != nil, "prefix \(n)")
        }
        let xml = PropertyList.encodeXML(richValue())
        let end = xml.count - 1  // everything up to and including "</plist>" is needed
        var failures = 0
        for n in stride(from: 0, to: end, by: 1)
        where plistFailure({ try PropertyList.decodeXML(xml.prefix(n)) }) != nil {
            failures += 1
        }
        #expect(failures == end)
    }

    @Test func randomMutationsNeverCrash() throws {
        var rng = SplitMix64(seed: 0xD0C_F5)
        let bases = [
            PropertyList.encodeBinary(richValue()), try corelibsBinary(Self.distinctSamples()[0]),
            try Self.repeatedSamples()[1],
        ]
        var decoded = 0
        var rejected = 0
        let start = ContinuousClock.now
        for i in 0..<4000 {
            var bytes = [UInt8](bases[i % bases.count])
            let edits = 1 + rng.below(4)
            for _ in 0..<edits {
                // half the edits hit the trailer and offset table, the rest anywhere
                let pos =
                    rng.below(2) == 0
                    ? bytes.count - 1 - rng.below(min(64, bytes.count)) : rng.below(bytes.count)
                switch rng.below(3) {
                case 0: bytes[pos] = UInt8(truncatingIfNeeded: rng.next())
                case 1: bytes[pos] ^= UInt8(1) << UInt8(rng.below(8))
                default: bytes[pos] = [0x00, 0x0F, 0x7F, 0x80, 0xFF][rng.below(5)]
                }
            }
            if plistFailure({ try PropertyList.decodeBinary(Data(bytes)) }) == nil {
                decoded += 1
            } else {
                rejected += 1
            }
        }
        let xml = [UInt8](PropertyList.encodeXML(richValue()))
        for _ in 0..<1500 {
            var bytes = xml
            for _ in 0..<(1 + rng.below(3)) {
                let pos = rng.below(bytes.count)
                let alphabet = Array("<>/&;=\"x0 \n\u{7f}".utf8)
                bytes[pos] = alphabet[rng.below(alphabet.count)]
            }
            if plistFailure({ try PropertyList.decodeXML(Data(bytes)) }) == nil {
                decoded += 1
            } else {
                rejected += 1
            }
        }
        #expect(decoded + rejected == 5500)
        #expect(rejected > 0)
        #expect(ContinuousClock.now - start < .seconds(30))
    }

    @Test func cyclesAreRejected() throws {
        let selfArray = bplist([hexBytes("a1 00")])
        let e1 = try #require(plistFailure { try PropertyList.decodeBinary(selfArray) })
        #expect(e1.reason.contains("contains itself"))
        let indirect = bplist([hexBytes("a2 01 02"), hexBytes("a1 03"), hexBytes("51 61"), hexBytes("a1 00")])
        #expect(plistFailure { try PropertyList.decodeBinary(indirect) } != nil)
        let selfDict = bplist([hexBytes("d1 01 00"), hexBytes("51 6b")])
        #expect(plistFailure { try PropertyList.decodeBinary(selfDict) } != nil)
        let keyIsSelf = bplist([hexBytes("d1 00 01"), hexBytes("09")])
        let e2 = try #require(plistFailure { try PropertyList.decodeBinary(keyIsSelf) })
        #expect(e2.reason.contains("not a string"))
    }

    @Test func deepNestingBombs() throws {
        // binary: 10,000 nested one-element arrays
        var objects: [[UInt8]] = []
        for i in 0..<10_000 { objects.append([0xA1] + be(UInt64(i + 1), 2)) }
        objects.append([0x08])
        let start = ContinuousClock.now
        let e = try #require(plistFailure { try PropertyList.decodeBinary(bplist(objects, refSize: 2)) })
        #expect(e.reason.contains("deeper than the limit of 512"))
        // XML: 10,000 nested arrays
        let xml = xmlDoc(
            String(repeating: "<array>", count: 10_000) + String(repeating: "</array>", count: 10_000) + "\n")
        let x = try #require(plistFailure { try PropertyList.decodeXML(xml) })
        #expect(x.line == 3 && x.column == 1 + 7 * 512)
        #expect(ContinuousClock.now - start < .seconds(5))
        // exactly at the limit is fine; one more is not
        func nested(_ n: Int) -> Data {
            xmlDoc(String(repeating: "<array>", count: n) + String(repeating: "</array>", count: n) + "\n")
        }
        #expect(plistFailure { try PropertyList.decodeXML(nested(512)) } == nil)
        #expect(plistFailure { try PropertyList.decodeXML(nested(513)) } != nil)
        let limits = PropertyList.Limits(maximumDepth: 1000)
        #expect(plistFailure { try PropertyList.decodeXML(nested(900), limits: limits) } == nil)
        var small: [[UInt8]] = (0..<512).map { [0xA1] + be(UInt64($0 + 1), 2) }
        small.append([0x09])
        #expect(plistFailure { try PropertyList.decodeBinary(bplist(small, refSize: 2)) } == nil)
        small.insert([0xA1, 0x00, 0x01], at: 0)
        small = small.enumerated().map { i, o in i == 0 ? o : [0xA1] + be(UInt64(i + 1), 2) }
        small[small.count - 1] = [0x09]
        #expect(plistFailure { try PropertyList.decodeBinary(bplist(small, refSize: 2)) } != nil)
    }

    @Test func dagBlowUpFailsFast() throws {
        // 40 levels, each an array holding the next level twice: 2^40 leaves if expanded
        var objects: [[UInt8]] = (0..<40).map { [0xA2, UInt8($0 + 1), UInt8($0 + 1)] }
        objects.append([0x09])
        let start = ContinuousClock.now
        let e = try #require(plistFailure { try PropertyList.decodeBinary(bplist(objects)) })
        #expect(e.reason.contains("more than"))
        #expect(ContinuousClock.now - start < .seconds(2))
        // a small DAG is fine and expands
        var ok: [[UInt8]] = (0..<10).map { [0xA2, UInt8($0 + 1), UInt8($0 + 1)] }
        ok.append([0x09])
        let v = try PropertyList.decodeBinary(bplist(ok))
        var depth = 0
        var cur = v
        while case .array(let a) = cur, let first = a.first {
            depth += 1
            cur = first
        }
        #expect(depth == 10)
        // the same big string referenced many times is bounded by maximumSize
        let limits = PropertyList.Limits(maximumSize: 4096)
        var refs: [UInt8] = [0xAF, 0x10, 200]
        refs += [UInt8](repeating: 1, count: 200)
        let bigString: [UInt8] = [0x5F, 0x10, 100] + [UInt8](repeating: 0x61, count: 100)
        #expect(
            plistFailure { try PropertyList.decodeBinary(bplist([refs, bigString]), limits: limits) } != nil)
        #expect(plistFailure { try PropertyList.decodeBinary(bplist([refs, bigString])) } == nil)
    }

    @Test func hostileOffsetsAndCounts() throws {
        let good = [UInt8](bplist([hexBytes("a2 01 02"), hexBytes("51 61"), hexBytes("10 05")]))
        #expect(try PropertyList.decodeBinary(Data(good)) == ["a", 5])
        let n = good.count
        func patched(_ at: Int, _ value: [UInt8]) -> Data {
            var b = good
            for (i, v) in value.enumerated() { b[at + i] = v }
            return Data(b)
        }
        let table = n - 32 - 3
        let cases: [(String, Data)] = [
            ("offset past the end", patched(table + 1, [0xF0])),
            ("offset into header", patched(table + 1, [0x02])),
            ("offset size 0", patched(n - 26, [0])),
            ("offset size 9", patched(n - 26, [9])),
            ("ref size 0", patched(n - 25, [0])),
            ("object count 0", patched(n - 24, be(0, 8))),
            ("object count huge", patched(n - 24, be(UInt64.max, 8))),
            ("object count too big for table", patched(n - 24, be(4, 8))),
            ("top object out of range", patched(n - 16, be(3, 8))),
            ("table offset past end", patched(n - 8, be(UInt64.max, 8))),
            ("table offset inside header", patched(n - 8, be(4, 8))),
            ("ref past object count", patched(9, [0x07])),
            ("array count past end", patched(8, [0xAE])),
            ("huge array count", Data(bplist([hexBytes("af 13 7f ff ff ff ff ff ff ff 01")]))),
            ("huge count 8-byte unsigned", Data(bplist([hexBytes("5f 13 ff ff ff ff ff ff ff ff 61")]))),
            ("huge UTF-16 count", Data(bplist([hexBytes("6f 13 40 00 00 00 00 00 00 00 61")]))),
            ("huge data count", Data(bplist([hexBytes("4f 12 ff ff ff ff 00")]))),
            ("huge dict count", Data(bplist([hexBytes("df 13 40 00 00 00 00 00 00 00")]))),
            ("integer past end", Data(bplist([hexBytes("13 00 00")]))),
            ("wrong magic", Data(Array("bplist15".utf8) + good[8...])),
            ("not a plist", Data(repeating: 0, count: 64)),
            ("too short", Data("bplist00".utf8)),
        ]
        for (name, data) in cases {
            #expect(plistFailure { try PropertyList.decodeBinary(data) } != nil, "\(name)")
        }
        let e = try #require(plistFailure { try PropertyList.decodeBinary(patched(table + 1, [0xF0])) })
        #expect(e.reason == "binary: object 1 offset 0xf0 past the end of the object area (0xf)")
        #expect(e.line == nil && e.description == e.reason)
    }

    @Test func rejectedObjects() throws {
        let sets = try #require(
            plistFailure { try PropertyList.decodeBinary(bplist([hexBytes("c1 01"), hexBytes("09")])) })
        #expect(sets.reason.contains("sets"))
        for hex in ["00", "0f", "0c", "70", "71 61", "90", "b1 00", "e0", "f0", "34 00 00 00 00 00 00 00 00"]
        {
            #expect(plistFailure { try PropertyList.decodeBinary(bplist([hexBytes(hex)])) } != nil, "\(hex)")
        }
        let intKey = try #require(
            plistFailure {
                try PropertyList.decodeBinary(
                    bplist([hexBytes("d1 01 02"), hexBytes("10 01"), hexBytes("09")]))
            })
        #expect(intKey.reason == "binary: dictionary (object 0) key #0 is object 1 (integer), not a string")
        let dupKey = try #require(
            plistFailure {
                try PropertyList.decodeBinary(
                    bplist([hexBytes("d2 01 01 02 02"), hexBytes("51 6b"), hexBytes("09")]))
            })
        #expect(dupKey.reason.contains("duplicate key \"k\""))
        for header in ["bplist15", "bplist16", "bplist01"] {
            var b = [UInt8](bplist([hexBytes("09")]))
            b.replaceSubrange(0..<8, with: Array(header.utf8))
            #expect(plistFailure { try PropertyList.decodeBinary(Data(b)) } != nil, "\(header)")
        }
    }

    @Test func limits() throws {
        let bin = PropertyList.encodeBinary(richValue())
        let xml = PropertyList.encodeXML(richValue())
        let tiny = PropertyList.Limits(maximumSize: 100)
        #expect(plistFailure { try PropertyList.decodeBinary(bin, limits: tiny) } != nil)
        #expect(plistFailure { try PropertyList.decodeXML(xml, limits: tiny) } != nil)
        let few = PropertyList.Limits(maximumObjectCount: 10)
        #expect(plistFailure { try PropertyList.decodeBinary(bin, limits: few) } != nil)
        #expect(plistFailure { try PropertyList.decodeXML(xml, limits: few) } != nil)
        #expect(
            PropertyList.Limits.standard
                == PropertyList.Limits(maximumSize: 64 << 20, maximumDepth: 512, maximumObjectCount: 1 << 22))
        #expect(PropertyList.isBinary(Data("bplist00".utf8)))
        #expect(!PropertyList.isBinary(Data("bplist1".utf8)))
        #expect(PropertyList.isBinary([UInt8]("bplist00xyz".utf8)))
    }

    // MARK: XML reader

    @Test func xmlErrorLocations() throws {
        func failure(_ body: String) -> PropertyListError? {
            plistFailure { try PropertyList.decodeXML(xmlDoc(body)) }
        }
        // misspelled closing tag
        let e1 = try #require(failure("<dict>\n\t<key>n</key>\n\t<integer>5</integr>\n</dict>\n"))
        #expect(e1.line == 5 && e1.column == 12)
        #expect(e1.reason == "expected </integer>, found </integr>")
        #expect(e1.description == "line 5, column 12: expected </integer>, found </integr>")
        // missing </dict>
        let e2 = try #require(failure("<dict>\n\t<key>a</key>\n\t<string>x</string>\n"))
        #expect(e2.line == 6 && e2.column == 1)
        #expect(e2.reason == "expected </dict>, found </plist>")
        // key without value
        let e3 = try #require(failure("<dict>\n\t<key>a</key>\n</dict>\n"))
        #expect(e3.line == 5 && e3.column == 1)
        #expect(e3.reason == "expected a value for key \"a\", found </dict>")
        // value without key
        let e4 = try #require(failure("<dict>\n\t<string>x</string>\n</dict>\n"))
        #expect(e4.line == 4 && e4.column == 2)
        #expect(e4.reason == "expected <key> or </dict>, found <string>")
        // bad integer (points at the element's text)
        let e5 = try #require(failure("<integer>12x</integer>\n"))
        #expect(e5.line == 3 && e5.column == 10)
        #expect(e5.reason == "bad integer \"12x\"")
        let e5b = try #require(failure("<integer>99999999999999999999</integer>\n"))
        #expect(e5b.reason == "integer 99999999999999999999 out of range (Int64.min...UInt64.max)")
        #expect(failure("<integer>-9223372036854775809</integer>\n") != nil)
        #expect(failure("<integer></integer>\n") != nil)
        #expect(failure("<integer> 5</integer>\n") != nil)
        // bad base64 (points at the character)
        let e6 = try #require(failure("<data>\n\tAQ!D\n</data>\n"))
        #expect(e6.line == 4 && e6.column == 4)
        #expect(e6.reason == "invalid character '!' in <data>")
        let e6b = try #require(failure("<data>AQI</data>\n"))
        #expect(e6b.line == 3 && e6b.column == 7)
        #expect(failure("<data>AQ==AQ==</data>\n") != nil)
        // bad date
        let e7 = try #require(failure("<date>2001-02-30T00:00:00Z</date>\n"))
        #expect(e7.line == 3 && e7.column == 7)
        #expect(e7.reason.hasPrefix("bad date \"2001-02-30T00:00:00Z\""))
        for bad in [
            "2001-01-01T00:00:00", "2001-1-01T00:00:00Z", "2001-01-01 00:00:00Z", "2001-01-01T24:00:00Z", "5",
        ] {
            #expect(failure("<date>\(bad)</date>\n") != nil, "\(bad)")
        }
        // garbage after </plist>
        let e8 = try #require(
            plistFailure {
                try PropertyList.decodeXML(
                    Data(
                        (String(decoding: xmlDoc("<true/>\n"), as: UTF8.self) + "<!-- ok -->\n  junk\n").utf8)
                )
            })
        #expect(e8.line == 6 && e8.column == 3)
        #expect(e8.reason == "unexpected text \"junk\" after the end of the property list")
        // unknown entity
        let e9 = try #require(failure("<string>a &foo; b</string>\n"))
        #expect(e9.line == 3 && e9.column == 11)
        #expect(e9.reason == "unknown entity &foo;")
        // duplicate key names both places
        let e10 = try #require(failure("<dict>\n\t<key>a</key><true/>\n\t<key>a</key><false/>\n</dict>\n"))
        #expect(e10.line == 5 && e10.column == 2)
        #expect(e10.reason == "duplicate key \"a\" (first at line 4, column 2)")
        // columns count Unicode scalars, not bytes
        let e11 = try #require(failure("<string>é😀</strin>\n"))
        #expect(e11.line == 3 && e11.column == 11)
        // unknown element, stray text, second top-level value, empty plist
        let e12 = try #require(failure("<array>\n\t<strng>x</strng>\n</array>\n"))
        #expect(e12.line == 4 && e12.column == 2 && e12.reason == "unknown element <strng>")
        let e13 = try #require(failure("<array>\n\ttext\n</array>\n"))
        #expect(e13.line == 4 && e13.column == 2)
        #expect(failure("<string>a</string>\n<string>b</string>\n") != nil)
        #expect(failure("") != nil)
        #expect(failure("<key>k</key>\n") != nil)
        #expect(failure("<string>a<b/></string>\n") != nil)
        #expect(failure("<string>&#xD800;</string>\n") != nil)
        #expect(failure("<string>a & b</string>\n") != nil)
        #expect(failure("<true>x</true>\n") != nil)
        #expect(failure("<array><!-- unterminated </array>\n") != nil)
        #expect(
            plistFailure {
                try PropertyList.decodeXML(
                    Data([
                        0x3C, 0x73, 0x74, 0x72, 0x69, 0x6E, 0x67, 0x3E, 0xC3, 0x28, 0x3C, 0x2F, 0x73, 0x74,
                        0x72, 0x69, 0x6E, 0x67, 0x3E,
                    ]))
            } != nil)
        #expect(
            plistFailure {
                try PropertyList.decodeXML(
                    Data("<?xml version=\"1.0\" encoding=\"UTF-16\"?><plist><true/></plist>".utf8))
            } != nil)
        // unexpected end of input
        let e14 = try #require(
            plistFailure { try PropertyList.decodeXML(Data("<plist>\n<array>\n\t<true/>\n".utf8)) })
        #expect(e14.line == 4 && e14.column == 1)
        #expect(e14.reason == "unexpected end of input, expected </array>")
    }

    @Test func xmlAcceptedForms() throws {
        let doc =
            "\u{FEFF}<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!-- leading comment -->\n"
            + "<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n"
            + "<plist version=\"1.0\"><!-- c -->\n<dict>\n"
            + "  <!-- between --><key>s</key> <string>a&lt;b&gt;c&amp;d&quot;e&apos;f&#65;&#x42;<![CDATA[<raw & stuff>]]>g<!-- inner -->h</string>\n"
            + "  <key>empty</key><string/>\n  <key/><array/>\n  <key>d</key><dict/>\n  <key>bin</key><data/>\n"
            + "  <key>hex</key><integer>0x1F</integer>\n  <key>neghex</key><integer>-0X1f</integer>\n  <key>plus</key><integer>+5</integer>\n"
            + "  <key>zeros</key><integer>012</integer>\n  <key>max</key><integer>18446744073709551615</integer>\n"
            + "  <key>min</key><integer>-9223372036854775808</integer>\n"
            + "  <key>reals</key><array><real>inf</real><real>-inf</real><real>+infinity</real><real>Infinity</real><real>.5</real><real> 1.5</real><real>1e400</real><real>-2E-3</real><real>7</real></array>\n"
            + "  <key>nan</key><real>NaN</real>\n"
            + "  <key>t</key><true></true>\n  <key>f</key><false/>\n"
            + "  <key>data</key><data>\n   AQ I\n\tD\n  </data>\n"
            + "  <key>uid</key><dict><key>CF$UID</key><integer>7</integer></dict>\n"
            + "  <key>bigUID</key><dict><key>CF$UID</key><integer>5000000000</integer></dict>\n"
            + "  <key>notUID</key><dict><key>CF$UID</key><string>7</string></dict>\n"
            + "</dict>\n</plist>\n<!-- trailing comment -->\n\n"
        let v = try PropertyList.decodeXML(Data(doc.utf8))
        let expected: PropertyListValue = [
            "s": "a<b>c&d\"e'fAB<raw & stuff>gh", "empty": "", "": [], "d": [:], "bin": .data(Data()),
            "hex": 31, "neghex": -31, "plus": 5, "zeros": 12, "max": .integer(Int128(UInt64.max)),
            "min": .integer(Int128(Int64.min)),
            "reals": [
                .real(.infinity), .real(-.infinity), .real(.infinity), .real(.infinity), 0.5, 1.5,
                .real(.infinity), -0.002, 7.0,
            ],
            "nan": .real(.nan), "t": true, "f": false, "data": .data(Data([1, 2, 3])), "uid": .uid(7),
            "bigUID": .uid(5_000_000_000),
            "notUID": ["CF$UID": "7"],
        ]
        #expect(v == expected)
        // a bare value without <plist>, as CF accepts
        #expect(try PropertyList.decodeXML(Data("<string>bare</string>".utf8)) == "bare")
        #expect(try PropertyList.decodeXML(Data("<plist><integer>5</integer></plist>".utf8)) == 5)
        // fractional dates
        #expect(try PropertyList.decodeXML(xmlDoc("<date>2001-01-01T00:00:01.25Z</date>\n")) == .date(1.25))
        #expect(try PropertyList.decodeXML(xmlDoc("<date>2001-01-01T00:00:01.2500Z</date>\n")) == .date(1.25))
    }

    // MARK: XML writer details

    @Test func xmlWriterLayout() throws {
        let v: PropertyListValue = ["z": "last?", "a": [], "m": [:], "e": "", "esc": "<a & b>", "n": -3]
        let text = String(decoding: PropertyList.encodeXML(v), as: UTF8.self)
        #expect(
            text == """
                <?xml version="1.0" encoding="UTF-8"?>
                <!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
                <plist version="1.0">
                <dict>
                \t<key>z</key>
                \t<string>last?</string>
                \t<key>a</key>
                \t<array/>
                \t<key>m</key>
                \t<dict/>
                \t<key>e</key>
                \t<string></string>
                \t<key>esc</key>
                \t<string>&lt;a &amp; b&gt;</string>
                \t<key>n</key>
                \t<integer>-3</integer>
                </dict>
                </plist>

                """)
        let data = String(
            decoding: PropertyList.encodeXML([.data(Data(repeating: 0xAB, count: 60))]), as: UTF8.self)
        #expect(
            data.contains(
                "\t<data>\n\t" + String(repeating: "q6ur", count: 17) + "\n\tq6urq6urq6ur\n\t</data>\n"))
    }

    // MARK: describe

    @Test func describeOutput() throws {
        let v: PropertyListValue = [
            "name": "DocFS", "n": 3, "list": [1, "two"], "blob": .data(Data([1, 2, 3])), "uid": .uid(3),
            "empty": [], "ok": true, "when": .date(1.25), "r": 0.5, "quote": "say \"hi\"\n",
        ]
        #expect(
            PropertyList.describe(v) == """
                {
                  "name" => "DocFS"
                  "n" => 3
                  "list" => [
                    0 => 1
                    1 => "two"
                  ]
                  "blob" => {length = 3, bytes = 0x010203}
                  "uid" => <CFKeyedArchiverUID>{value = 3}
                  "empty" => []
                  "ok" => true
                  "when" => 2001-01-01 00:00:01.25 +0000
                  "r" => 0.5
                  "quote" => "say \\"hi\\"\\n"
                }
                """)
        #expect(PropertyList.describe("top") == "\"top\"")
        #expect(
            PropertyList.describe(.data(Data(count: 40)))
                == "{length = 40, bytes = 0x00000000000000000000000000000000 ... 0000000000000000}")
    }

    @Test func valueSemantics() throws {
        #expect(PropertyListValue.real(.nan) == .real(.nan))
        #expect(PropertyListValue.real(0.0) != .real(-0.0))
        #expect(Set<PropertyListValue>([1, 1, "1", 1.0, true]).count == 4)
        let d: PropertyListValue = ["b": 1, "a": ["d": 1, "c": 2]]
        #expect(d["b"] == 1)
        #expect(d["zz"] == nil)
        #expect(d.sortedKeys() == ["a": ["c": 2, "d": 1], "b": 1])
        #expect(d != d.sortedKeys())
    }
}
