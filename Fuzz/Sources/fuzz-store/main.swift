// Fuzzes the store's decoding of what it reads back from SQLite: the xattr blob, and rows of the
// nodes, documents and versions tables whose columns hold any type (a damaged or hand-edited store
// can hold NULL, text or a blob where an integer belongs). Either a record or a thrown error.
@testable import DocumentEngine
import Foundation
import GRDB
@testable import SQLiteStore
import VersionedStore

private struct Bytes {
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
    mutating func int64() -> Int64 {
        take(8).reduce(Int64(0)) { $0 << 8 | Int64($1) }
    }
    /// One SQLite value of any of its five types.
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

private let nodeColumns = [
    "node", "document", "parent", "name", "preferred_name", "kind", "permissions", "uid", "gid", "mtime",
    "ctime", "atime", "btime", "size", "link_target", "xattrs", "version", "removed", "branch",
]
private let documentColumns = ["id", "name", "type", "kind", "root", "current_version", "created", "modified"]
private let versionColumns = [
    "id", "document", "base", "created", "origin", "branch", "resolved", "bytes_written",
]

private func row(_ columns: [String], _ bytes: inout Bytes) -> Row {
    Row(Dictionary(uniqueKeysWithValues: columns.map { ($0, bytes.value() as (any DatabaseValueConvertible)?) }))
}

// Also under libFuzzer's name: its main() (in the same archive as the driver) is linked too.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzOne(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    var bytes = Bytes(data: start.map { Array(UnsafeBufferPointer(start: $0, count: count)) } ?? [])
    switch bytes.byte() ?? 0 {
    case 0..<128:
        // The xattr blob alone; what decodes must encode to the same bytes when canonical.
        let blob = Data(bytes.take(count))
        if let xattrs = try? XattrCoding.decode(blob) {
            let again = XattrCoding.encode(xattrs)
            guard (try? XattrCoding.decode(again)) == xattrs else { fatalError("xattrs do not round-trip") }
        }
    case 128..<192:
        _ = try? SQLiteStore.record(row(nodeColumns, &bytes))
    case 192..<224:
        _ = try? SQLiteStore.document(row(documentColumns, &bytes))
    default:
        _ = try? SQLiteStore.version(row(versionColumns, &bytes))
    }
    return 0
}

// SwiftPM gives an executable its own entry point, so libFuzzer's main() is not used: this one
// hands the command line to libFuzzer's driver, which calls `fuzzOne` for every input.
typealias FuzzerDriver = @convention(c) (
    UnsafeMutablePointer<CInt>, UnsafeMutablePointer<UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>>,
    @convention(c) (UnsafePointer<UInt8>?, Int) -> CInt
) -> CInt
guard let driver = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "LLVMFuzzerRunDriver") else {
    fatalError("not built with -sanitize=fuzzer (scripts/fuzz.sh builds it)")
}
var argc = CommandLine.argc
var argv = CommandLine.unsafeArgv
exit(unsafeBitCast(driver, to: FuzzerDriver.self)(&argc, &argv, { fuzzOne($0, $1) }))
