// B6: the engine without the mount. Document.open of a package with many wrappers, and a save
// after changing one of them, from the store and from the same package as a native folder,
// interleaved round by round in one process.

import DocumentEngine
import Foundation
import PostgresStore
import SQLiteStore

#if canImport(Glibc)
    import Glibc
#endif

/// The store at `location`: a `postgres://` URL or an SQLite file, both existing.
func openStore(_ location: String) throws -> any DocumentStore {
    if PostgresStore.Configuration.isURL(location) {
        return try PostgresStore(configuration: PostgresStore.Configuration(url: location))
    }
    return try SQLiteStore(path: location)
}

/// A package document that keeps the wrapper it was read as, like an app that edits one file
/// of its package at a time.
final class PackageDocument: Document {
    var package: FileWrapper?

    override func contents(forType typeName: String) throws -> Any {
        guard let package else { throw DocumentError.unsupportedContents("nothing loaded") }
        return package
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        package = contents as? FileWrapper
    }
}

/// The process's I/O counters (`/proc/self/io`): rchar and wchar count every byte passed to
/// read and write calls, which for a folder document is the content it read or wrote.
struct ProcessIO {
    var readBytes: Int64
    var writtenBytes: Int64

    static func current() -> ProcessIO {
        let text = (try? String(contentsOfFile: "/proc/self/io", encoding: .utf8)) ?? ""
        var values: [String: Int64] = [:]
        for line in text.split(separator: "\n") {
            let parts = line.split(separator: ":")
            if parts.count == 2 {
                values[String(parts[0])] = Int64(parts[1].trimmingCharacters(in: .whitespaces))
            }
        }
        return ProcessIO(readBytes: values["rchar"] ?? 0, writtenBytes: values["wchar"] ?? 0)
    }
}

@MainActor
struct EngineBenchmark {
    let storePath: String
    let documentName: String
    let folder: String
    let rounds: Int

    func emit(_ figure: String, _ side: String, _ round: Int, _ value: Double) {
        print("\(figure)\t\(side)\t\(round)\t\(format(value))")
    }

    func run() async throws {
        let store = try openStore(storePath)
        // Reading /proc/self/io itself adds to rchar: measured once, subtracted from every delta.
        let a = ProcessIO.current()
        let b = ProcessIO.current()
        let probeCost = b.readBytes - a.readBytes

        for round in 1...rounds {
            // Alternate which side goes first, so neither always finds the caches the other warmed.
            let order = round % 2 == 1 ? [true, false] : [false, true]
            for fromStore in order {
                let side = fromStore ? "docfs" : "native"
                let document =
                    fromStore
                    ? PackageDocument(store: store, name: documentName)
                    : PackageDocument(fileURL: URL(fileURLWithPath: folder))

                // Open, and list the package's wrappers: a folder's FileWrapper reads its children
                // only when they are first asked for, so the open alone would flatter it.
                let statisticsBefore = store.statistics
                let ioBefore = ProcessIO.current()
                var start = now()
                guard await document.open(), let count = document.package?.fileWrappers?.count else {
                    throw SystemError("cannot open \(fromStore ? documentName : folder)", EIO)
                }
                let openMilliseconds = seconds(since: start) * 1000
                let ioAfterOpen = ProcessIO.current()
                let readBytes =
                    fromStore
                    ? Double(store.statistics.bytesRead - statisticsBefore.bytesRead)
                    : Double(ioAfterOpen.readBytes - ioBefore.readBytes - probeCost)
                emit("b6.open.ms", side, round, openMilliseconds)
                emit("b6.open.bytes", side, round, readBytes)
                emit("b6.wrappers", side, round, Double(count))

                // Change one wrapper and save.
                guard let package = document.package, let children = package.fileWrappers else {
                    throw SystemError("no package", EIO)
                }
                let key = children.keys.sorted()[children.count / 2]
                var bytes = [UInt8](repeating: 0, count: 4096)
                var random = PseudoRandom(seed: now())
                bytes.withUnsafeMutableBytes { random.fill($0) }
                package.removeFileWrapper(children[key]!)
                package.addRegularFile(withContents: Data(bytes), preferredFilename: key)
                document.updateChangeCount(.done)

                let savedBefore = store.statistics
                let ioBeforeSave = ProcessIO.current()
                start = now()
                guard await document.save(to: document.fileURL, for: .forOverwriting) else {
                    throw SystemError("cannot save \(fromStore ? documentName : folder)", EIO)
                }
                let saveMilliseconds = seconds(since: start) * 1000
                let ioAfterSave = ProcessIO.current()
                let writtenBytes =
                    fromStore
                    ? Double(store.statistics.bytesWritten - savedBefore.bytesWritten)
                    : Double(ioAfterSave.writtenBytes - ioBeforeSave.writtenBytes)
                emit("b6.save.ms", side, round, saveMilliseconds)
                emit("b6.save.bytes", side, round, writtenBytes)
                await document.close()
            }
        }
    }
}
