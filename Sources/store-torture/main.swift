// store-torture <store-path | postgres-url> <document-name> <rounds> [deferred|document|names]
//
// Saves `rounds` new versions of a package document, one after another, as fast as it can, so
// that a test can kill it with SIGKILL at arbitrary points of a save. Every file of round N holds
// bytes derived from N (see `TortureContents`), so a reader can tell which round each file is
// from; "saved N" is printed (unbuffered) only after round N's save has committed. Every fifth
// round it also collects garbage, so kills land in garbage collection too.
//
// With `deferred`, the document is a flat file and every save is a deferred (`durable` false)
// `.sparse` update to the bytes of `TortureContents.contents(round: N, index: N % fileCount)`;
// every fifth round it synchronizes the store instead, printing "synchronized".
//
// With `document`, the saves go through the engine's `Document` (an app's path): a package
// document whose contents are the round's files, saved with `save(to:for:)` round after round.
//
// With `names`, each round is a safe-save at a mount's root, as the mount commits it: a new flat
// document `<document-name>.tmp-N` with round N's bytes (one transaction), then the deletion of
// the document named `<document-name>` and the rename of the new one onto its name (one
// transaction), "saved N" printed once that committed; and an exchange of the names of the
// documents `<document-name>.a` and `<document-name>.b` (one transaction).

import DocumentEngine
import Foundation
import PostgresStore
import SQLiteStore

#if canImport(Glibc)
    import Glibc
#endif

/// The files of a round. Kept in step with the copy in StoreRobustnessTests.swift.
enum TortureContents {
    static let fileCount = 20

    /// File `index`'s name, and whether it is in the `sub` folder rather than at the top.
    static func place(_ index: Int) -> (inSub: Bool, name: String) {
        (index >= 10, String(format: "f%02d.bin", index))
    }

    /// A header naming the round and file, then bytes derived from both.
    static func contents(round: Int, index: Int) -> Data {
        let size = index % 7 == 0 ? 300_000 : 1_000 + index * 517
        var bytes = Array("round \(round) file \(index)\n".utf8)
        bytes.reserveCapacity(size)
        var state = UInt64(truncatingIfNeeded: round) &* 0x9E37_79B9_7F4A_7C15 &+ UInt64(index)
        while bytes.count < size {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            var word = state
            for _ in 0..<min(8, size - bytes.count) {
                bytes.append(UInt8(truncatingIfNeeded: word))
                word >>= 8
            }
        }
        return Data(bytes)
    }

    /// Puts round `round`'s files into `tree`, each in place of the file of its name, with a
    /// `sub` folder made if it has none.
    static func fill(_ tree: FileWrapper, round: Int) {
        let sub: FileWrapper
        if let existing = tree.fileWrappers?["sub"] {
            sub = existing
        } else {
            sub = FileWrapper(directoryWithFileWrappers: [:])
            sub.preferredFilename = "sub"
            tree.addFileWrapper(sub)
        }
        for index in 0..<fileCount {
            let (inSub, key) = place(index)
            let directory = inSub ? sub : tree
            if let old = directory.fileWrappers?[key] { directory.removeFileWrapper(old) }
            directory.addRegularFile(
                withContents: contents(round: round, index: index), preferredFilename: key)
        }
    }

    /// The round a file's header names, if it has one.
    static func round(of data: Data) -> Int? {
        // The header is text; the bytes after it are not.
        guard let end = data.prefix(64).firstIndex(of: 0x0A),
            let line = String(data: data[data.startIndex..<end], encoding: .utf8), line.hasPrefix("round ")
        else { return nil }
        return Int(line.dropFirst(6).split(separator: " ").first ?? "")
    }
}

func say(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data(("store-torture: " + message + "\n").utf8))
    exit(1)
}

/// The deferred mode: see the top of the file.
func saveDeferred(_ store: any DocumentStore, name: String, rounds: Int) throws {
    var info =
        try store.document(named: name)
        ?? store.createDocument(
            named: name, kind: .flat, type: nil, permissions: nil, origin: "store-torture")
    let stored = try store.readContents(of: info.root, at: nil, offset: 0, count: 64)
    var round = (TortureContents.round(of: stored) ?? 0) + 1
    for _ in 0..<rounds {
        let data = TortureContents.contents(round: round, index: round % TortureContents.fileCount)
        let chunkCount = (data.count + store.chunkSize - 1) / store.chunkSize
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.contents[info.root] = .sparse(
            size: Int64(data.count), chunks: Array(0..<chunkCount), source: DataContentsSource(data))
        changes.origin = "store-torture"
        changes.conflictPolicy = .fail
        changes.durable = false
        info.currentVersion = try store.save(changes).version.id
        say("saved \(round)")
        if round % 5 == 0 {
            try store.synchronize()
            say("synchronized")
        }
        round += 1
    }
}

/// The names mode: see the top of the file.
func saveByRenaming(_ store: any DocumentStore, name: String, rounds: Int) throws {
    for side in ["a", "b"] where try store.document(named: "\(name).\(side)") == nil {
        let info = try store.createDocument(
            named: "\(name).\(side)", kind: .flat, type: nil, permissions: nil, origin: "store-torture")
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.contents[info.root] = .replace(DataContentsSource(Data(side.utf8)))
        _ = try store.save(changes)
    }
    guard let a = try store.document(named: "\(name).a"), let b = try store.document(named: "\(name).b")
    else {
        fail("the documents to exchange are missing")
    }
    var round = 1
    if let current = try store.document(named: name) {
        round =
            (TortureContents.round(
                of: try store.readContents(of: current.root, at: nil, offset: 0, count: 64)) ?? 0) + 1
    }
    // A temporary document an earlier run left (killed between its two transactions) goes.
    for stale in try store.documents() where stale.name.hasPrefix("\(name).tmp-") {
        try store.deleteDocument(stale.id, origin: "store-torture")
    }
    for _ in 0..<rounds {
        let data = TortureContents.contents(round: round, index: round % TortureContents.fileCount)
        let temporary = try store.transaction(durable: true) { tx -> DocumentInfo in
            let info = try tx.createDocument(
                named: "\(name).tmp-\(round)", root: DocumentRoot(kind: .regularFile), type: nil,
                origin: "store-torture")
            var changes = DocumentChanges(document: info.id, base: info.currentVersion)
            changes.contents[info.root] = .replace(DataContentsSource(data))
            changes.origin = "store-torture"
            _ = try tx.save(changes)
            return info
        }
        try store.transaction(durable: true) { tx in
            if let replaced = try tx.document(named: name) {
                try tx.deleteDocument(replaced.id, origin: "store-torture")
            }
            _ = try tx.renameDocument(temporary.id, to: name)
        }
        say("saved \(round)")
        _ = try store.transaction(durable: true) { tx in try tx.exchangeDocuments(a.id, b.id) }
        round += 1
    }
}

/// The document mode: an app's `Document` in the store, saved over and over.
@MainActor
final class TortureDocument: Document {
    var round = 0
    var wrapper: FileWrapper?

    override func contents(forType typeName: String) throws -> Any {
        let tree = wrapper ?? FileWrapper(directoryWithFileWrappers: [:])
        TortureContents.fill(tree, round: round)
        wrapper = tree
        return tree
    }

    override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let tree = contents as? FileWrapper else { throw CocoaError(.fileReadCorruptFile) }
        wrapper = tree
        round =
            try tree.fileWrappers?["f00.bin"].flatMap {
                TortureContents.round(of: try $0.readContents(offset: 0, count: 64))
            } ?? 0
    }
}

@MainActor
func saveThroughDocument(_ store: any DocumentStore, name: String, rounds: Int) async {
    let document = TortureDocument(store: store, name: name)
    var exists = (try? store.document(named: name)) != nil
    if exists {
        guard await document.open() else { fail("could not open \(name)") }
    }
    for _ in 0..<rounds {
        document.round += 1
        document.updateChangeCount(.done)
        guard await document.save(to: document.fileURL, for: exists ? .forOverwriting : .forCreating) else {
            fail("the save of round \(document.round) failed")
        }
        exists = true
        say("saved \(document.round)")
    }
}

/// The store at a path (SQLite, created if missing) or a `postgres://` URL (the database must
/// exist; the store is created in it if missing).
func openStore(_ location: String) throws -> any DocumentStore {
    if location.hasPrefix("postgres://") || location.hasPrefix("postgresql://") {
        return try PostgresStore(configuration: PostgresStore.Configuration(url: location), options: .create)
    }
    return try SQLiteStore(path: location, options: .create)
}

let arguments = CommandLine.arguments
let deferred = arguments.count == 5 && arguments[4] == "deferred"
let throughDocument = arguments.count == 5 && arguments[4] == "document"
let renaming = arguments.count == 5 && arguments[4] == "names"
guard arguments.count == 4 || deferred || throughDocument || renaming, let rounds = Int(arguments[3]),
    rounds >= 0
else {
    fail("usage: store-torture <store-path> <document-name> <rounds> [deferred|document|names]")
}

if renaming {
    do {
        try saveByRenaming(openStore(arguments[1]), name: arguments[2], rounds: rounds)
    } catch {
        fail(String(describing: error))
    }
    exit(0)
}

if throughDocument {
    do {
        await saveThroughDocument(try openStore(arguments[1]), name: arguments[2], rounds: rounds)
    } catch {
        fail(String(describing: error))
    }
    exit(0)
}

if deferred {
    do {
        try saveDeferred(openStore(arguments[1]), name: arguments[2], rounds: rounds)
    } catch {
        fail(String(describing: error))
    }
    exit(0)
}

do {
    let store = try openStore(arguments[1])
    let name = arguments[2]
    var info =
        try store.document(named: name)
        ?? store.createDocument(
            named: name, kind: .package, type: nil, permissions: nil, origin: "store-torture")
    // Continue after the round the document is at, so rounds only grow across runs.
    var round = 1
    let current = try store.fileWrapper(for: info.id)
    if let first = current.fileWrappers?["f00.bin"],
        let last = TortureContents.round(of: try first.readContents(offset: 0, count: 64))
    {
        round = last + 1
    }
    for _ in 0..<rounds {
        let tree: FileWrapper
        if round % 2 == 0 {
            // A tree built from scratch: the store matches new wrappers to nodes by place.
            tree = FileWrapper(directoryWithFileWrappers: [:])
        } else {
            // The stored tree, with every file replaced in place.
            tree = try store.fileWrapper(for: info.id, at: info.currentVersion)
        }
        TortureContents.fill(tree, round: round)
        let result = try store.save(
            tree, to: info.id, base: info.currentVersion, origin: "store-torture", conflictPolicy: .fail)
        info.currentVersion = result.version.id
        say("saved \(round)")
        if round % 5 == 0 {
            _ = try store.collectGarbage(RetentionPolicy(keepLast: 3, keepFor: .zero))
            say("collected")
        }
        round += 1
    }
} catch {
    fail(String(describing: error))
}
