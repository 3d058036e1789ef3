import Foundation
import GRDB
import Testing

@testable import DocumentEngine
@testable import SQLiteStore
@testable import VersionedStore

/// The short form of the fuzzing: every input kept under Tests/FuzzCorpus (the
/// seeds, and each input a fuzzer found a crash with) goes through the same decoders as the
/// libFuzzer targets in Fuzz/ (scripts/fuzz.sh), with the same checks. A crash here is a crash
/// there.
@Suite struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent()
        .appendingPathComponent("FuzzCorpus")

    static func inputs(_ target: String) throws -> [(String, Data)] {
        let folder = corpus.appendingPathComponent(target)
        return try FileManager.default.contentsOfDirectory(atPath: folder.path).sorted().map {
            ($0, try Data(contentsOf: folder.appendingPathComponent($0)))
        }
    }

    @Test func serializedWrappers() throws {
        let inputs = try Self.inputs("wrapper")
        #expect(inputs.count >= 3)
        var decoded = 0
        for (name, data) in inputs {
            guard let wrapper = try? FileWrapper(validatingSerializedRepresentation: data) else { continue }
            decoded += 1
            let again = try #require(wrapper.serializedRepresentation, "\(name)")
            #expect(
                try FileWrapper(validatingSerializedRepresentation: again).serializedRepresentation == again,
                "\(name)")
        }
        #expect(decoded >= 3, "the seeds decode")
    }

    @Test func keyedArchives() throws {
        let inputs = try Self.inputs("archive")
        #expect(inputs.count >= 5)
        var decoded = 0
        for (_, data) in inputs {
            let limits = KeyedArchive.Limits(
                maximumSize: 1 << 20, maximumObjectCount: 1 << 14, maximumDepth: 64)
            _ = try? KeyedArchive.validate(data, allowedClassNames: [], limits: limits)
            let object = try? KeyedArchive.unarchivedObject(
                ofClasses: [
                    NSArray.self, NSDictionary.self, NSString.self, NSNumber.self, NSData.self, NSDate.self,
                    NSSet.self, NSOrderedSet.self, NSURL.self, NSUUID.self, NSNull.self,
                ],
                from: data, limits: limits)
            if object != nil { decoded += 1 }
        }
        #expect(decoded >= 5, "the seeds decode")
    }

    /// What Fuzz/Sources/fuzz-plist does with one input (keep the two alike).
    @Test func propertyLists() throws {
        let inputs = try Self.inputs("plist")
        #expect(inputs.count >= 5)
        var decoded = 0
        let limits = PropertyList.Limits(maximumSize: 1 << 20, maximumDepth: 64, maximumObjectCount: 1 << 14)
        for (name, data) in inputs {
            let decoders: [(Data) -> PropertyListValue?] = [
                { try? PropertyList.decodeXML($0, limits: limits) },
                { try? PropertyList.decodeBinary($0, limits: limits) },
            ]
            for decode in decoders {
                guard let value = decode(data) else { continue }
                decoded += 1
                // Through XML everything but a NaN's payload survives: the text comes back.
                let text = PropertyList.encodeXML(value)
                #expect(
                    try PropertyList.encodeXML(PropertyList.decodeXML(text, limits: limits)) == text,
                    "\(name)")
                #expect(
                    try PropertyList.decodeBinary(PropertyList.encodeBinary(value), limits: limits) == value,
                    "\(name)")
                _ = PropertyList.describe(value)
            }
            _ = try? PropertyListText.compile(data, as: .keyedArchive)
        }
        #expect(decoded >= 5, "the seeds decode")
    }

    @Test func storeRecords() throws {
        let inputs = try Self.inputs("store")
        #expect(inputs.count >= 2)
        for (_, data) in inputs { StoreFuzzInput.run(Array(data)) }
    }
}

/// What Fuzz/Sources/fuzz-store does with one input (keep the two alike): the first byte picks
/// the xattr blob decoder or a row of the nodes, documents or versions table whose every column
/// holds a value of any SQLite type taken from the following bytes.
enum StoreFuzzInput {
    struct Bytes {
        var data: [UInt8]
        var at = 0
        mutating func byte() -> UInt8? {
            guard at < data.count else { return nil }
            defer { at += 1 }
            return data[at]
        }
        mutating func take(_ n: Int) -> [UInt8] {
            let n = min(n, data.count - at)
            defer { at += n }
            return Array(data[at..<at + n])
        }
        mutating func int64() -> Int64 { take(8).reduce(Int64(0)) { $0 << 8 | Int64($1) } }
        mutating func value() -> DatabaseValue {
            switch (byte() ?? 1) % 8 {
            case 0: return .null
            case 1, 2, 3: return Int64(Int8(bitPattern: byte() ?? 0)).databaseValue
            case 4: return int64().databaseValue
            case 5: return Double(bitPattern: UInt64(bitPattern: int64())).databaseValue
            case 6: return String(decoding: take(Int(byte() ?? 0) % 16), as: UTF8.self).databaseValue
            default: return Data(take(Int(byte() ?? 0) % 64)).databaseValue
            }
        }
    }

    static let nodeColumns = [
        "node", "document", "parent", "name", "preferred_name", "kind", "permissions", "uid", "gid", "mtime",
        "ctime", "atime", "btime", "size", "link_target", "xattrs", "version", "removed", "branch",
    ]
    static let documentColumns = [
        "id", "name", "type", "kind", "root", "current_version", "created", "modified",
    ]
    static let versionColumns = [
        "id", "document", "base", "created", "origin", "branch", "resolved", "bytes_written",
    ]

    static func row(_ columns: [String], _ bytes: inout Bytes) -> Row {
        Row(
            Dictionary(
                uniqueKeysWithValues: columns.map { ($0, bytes.value() as (any DatabaseValueConvertible)?) }))
    }

    static func run(_ data: [UInt8]) {
        var bytes = Bytes(data: data)
        switch bytes.byte() ?? 0 {
        case 0..<128:
            let blob = Data(bytes.take(data.count))
            if let xattrs = try? XattrCoding.decode(blob) {
                precondition(
                    (try? XattrCoding.decode(XattrCoding.encode(xattrs))) == xattrs,
                    "xattrs do not round-trip")
            }
        case 128..<192: _ = try? SQLiteStore.record(row(nodeColumns, &bytes))
        case 192..<224: _ = try? SQLiteStore.document(row(documentColumns, &bytes))
        default: _ = try? SQLiteStore.version(row(versionColumns, &bytes))
        }
    }
}
