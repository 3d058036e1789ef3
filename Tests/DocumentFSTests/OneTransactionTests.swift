import CLinuxSupport
import DocumentEngine
import DocumentFS
import Foundation
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Every system call that changes names or contents is at most one store transaction, so that a
/// crash at any instant leaves the store as it was before the call or after it. The
/// mount's background saves are held, and each call's transactions counted
/// (``StoreStatistics/transactionsCommitted``); what it did is then read through another
/// connection. Calls inside a package change the document in the mount only: its next save
/// point commits them, in one transaction.
@Suite(.serialized)
struct OneTransactionTests {
    /// Runs `call` off the test's thread, and returns the transactions it committed.
    static func transactions(
        _ store: any DocumentStore, _ what: String, _ call: @escaping @Sendable () throws -> Void
    ) async throws -> Int {
        let before = store.statistics.transactionsCommitted
        try await offThread(call)
        let count = store.statistics.transactionsCommitted - before
        #expect(count <= 1, "\(what) committed \(count) transactions")
        return count
    }

    static let noReplace: UInt32 = 1
    static let exchange: UInt32 = 2

    static func rename(_ from: String, _ to: String, flags: UInt32 = 0) throws {
        _ = try sys(docfs_renameat2(AT_FDCWD, from, AT_FDCWD, to, flags), "rename \(from) \(to)")
    }

    @Test(
        "calls at the root: each is one transaction, and its result is in the store at once",
        arguments: StoreKind.all)
    func atTheRoot(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let store = fixture.store
        try await withMount(store, configure: { $0.fileSystem.collectionInterval = nil }) { mount in
            mount.mount.fileSystem.holdBackgroundSaves(true)
            let m = mount.path
            func count(_ what: String, _ call: @escaping @Sendable () throws -> Void) async throws -> Int {
                try await Self.transactions(store, what, call)
            }
            // The pool of node ids is filled before anything is counted.
            _ = try await count("a first create") {
                try OpenedFile(m + "/first.txt", O_CREAT | O_WRONLY).close()
            }

            #expect(
                try await count("create") { try OpenedFile(m + "/new.txt", O_CREAT | O_WRONLY).close() } == 1)
            #expect(try engine.text("new.txt") == "")
            #expect(try engine.record("new.txt")?.uid == getuid())
            #expect(try await count("mkdir") { _ = try sys(mkdir(m + "/New.pkg", 0o755)) } == 1)
            #expect(try await count("symlink") { _ = try sys(symlink("Flat.txt", m + "/link")) } == 1)
            #expect(try await count("mknod") { _ = try sys(mkfifo(m + "/fifo", 0o644)) } == 1)
            #expect(try Set(engine.documentNames()).isSuperset(of: ["New.pkg", "link", "fifo"]))

            // A safe-save: a temporary document, synced, renamed over the name, the folder synced.
            try writeText(m + "/Flat.txt.tmp-1", "new contents\n")
            let temporary = try OpenedFile(m + "/Flat.txt.tmp-1", O_RDONLY)
            _ = try sys(fsync(temporary.fd))
            temporary.close()
            #expect(
                try await count("rename over a document") {
                    try Self.rename(m + "/Flat.txt.tmp-1", m + "/Flat.txt")
                } == 1)
            // The fsync's changes may be in the store's intent log, for the committer (held) to save.
            #expect(try readText(m + "/Flat.txt") == "new contents\n")
            mount.mount.fileSystem.saveAll(durable: true)
            #expect(try engine.text("Flat.txt") == "new contents\n")
            #expect(try !engine.documentNames().contains("Flat.txt.tmp-1"))
            #expect(
                try await count("fsync of the root") {
                    let root = try OpenedFile(m, O_RDONLY | O_DIRECTORY)
                    _ = try sys(fsync(root.fd))
                } <= 1)

            #expect(
                try await count("rename to a free name") {
                    try Self.rename(m + "/new.txt", m + "/renamed.txt")
                } == 1)
            #expect(
                try await count("RENAME_NOREPLACE") {
                    try Self.rename(m + "/renamed.txt", m + "/kept.txt", flags: Self.noReplace)
                } == 1)
            let refused = try await count("RENAME_NOREPLACE onto a name") {
                let error = errnoOf(
                    docfs_renameat2(AT_FDCWD, m + "/kept.txt", AT_FDCWD, m + "/Flat.txt", Self.noReplace))
                if error != EEXIST { throw TestFailure("RENAME_NOREPLACE onto a name: errno \(error)") }
            }
            #expect(refused == 0)
            let flat = try engine.document("Flat.txt").id
            let kept = try engine.document("kept.txt").id
            #expect(
                try await count("RENAME_EXCHANGE") {
                    try Self.rename(m + "/kept.txt", m + "/Flat.txt", flags: Self.exchange)
                } == 1)
            #expect(try engine.document("Flat.txt").id == kept && engine.document("kept.txt").id == flat)
            #expect(try readText(m + "/kept.txt") == "new contents\n")

            // A scratch file renamed onto a name publishes it: over a document, and as a new one.
            try writeText(m + "/.goutputstream-ABC123", "published\n")
            #expect(
                try await count("publish over a document") {
                    try Self.rename(m + "/.goutputstream-ABC123", m + "/kept.txt")
                } == 1)
            #expect(try engine.text("kept.txt") == "published\n")
            try writeText(m + "/.goutputstream-DEF456", "a new one\n")
            #expect(
                try await count("publish as a new document") {
                    try Self.rename(m + "/.goutputstream-DEF456", m + "/fresh.txt")
                } == 1)
            #expect(try engine.text("fresh.txt") == "a new one\n")
            #expect(try engine.versions("fresh.txt").count == 1, "created with its contents, as one version")
            #expect(try engine.record("fresh.txt")?.uid == getuid())

            #expect(try await count("unlink") { _ = try sys(unlink(m + "/fresh.txt")) } == 1)
            #expect(try await count("rmdir") { _ = try sys(rmdir(m + "/New.pkg")) } == 1)
            #expect(
                try !engine.documentNames().contains("fresh.txt")
                    && !engine.documentNames().contains("New.pkg"))
        }
    }

    @Test(
        "calls in a package wait for the save point, which commits them in one transaction; moves between documents are one",
        arguments: StoreKind.all)
    func inPackages(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let store = fixture.store
        try await withMount(store, configure: { $0.fileSystem.collectionInterval = nil }) { mount in
            mount.mount.fileSystem.holdBackgroundSaves(true)
            let w = mount.path + "/Work.pkg"
            func count(_ what: String, _ call: @escaping @Sendable () throws -> Void) async throws -> Int {
                try await Self.transactions(store, what, call)
            }
            _ = try await count("a first look") { _ = try entries(in: w) }
            #expect(try await count("create and write") { try writeText(w + "/a.txt", "a\n") } == 0)
            #expect(try await count("link") { _ = try sys(link(w + "/a.txt", w + "/b.txt")) } == 0)
            #expect(
                try await count("rename") { try Self.rename(w + "/notes.txt", w + "/sub/notes.txt") } == 0)
            #expect(try await count("unlink") { _ = try sys(unlink(w + "/link")) } == 0)
            #expect(
                try await count("fsync of the package") {
                    let folder = try OpenedFile(w, O_RDONLY | O_DIRECTORY)
                    _ = try sys(fsync(folder.fd))
                } <= 1)
            // The fsync's changes may be in the store's intent log, for the committer (held) to save.
            mount.mount.fileSystem.saveAll(durable: true)
            #expect(
                try engine.paths("Work.pkg") == ["a.txt", "b.txt", "sub", "sub/inner.txt", "sub/notes.txt"])
            #expect(
                try await count("a move between packages") {
                    try Self.rename(w + "/sub/notes.txt", mount.path + "/Other.pkg/notes.txt")
                } == 1)
            #expect(try engine.paths("Other.pkg") == ["notes.txt", "other.txt"])
            #expect(
                try await count("a move to the root") { try Self.rename(w + "/a.txt", mount.path + "/a.txt") }
                    == 1)
            #expect(try engine.text("a.txt") == "a\n")
            #expect(
                try await count("an exchange between documents") {
                    try Self.rename(
                        mount.path + "/a.txt", mount.path + "/Other.pkg/other.txt", flags: Self.exchange)
                } == 1)
            #expect(try engine.text("Other.pkg", "other.txt") == "a\n")
        }
    }

    @Test("the Trash: a move in, a restore and emptying are one transaction each", arguments: StoreKind.all)
    func trash(_ kind: StoreKind) async throws {
        let fixture = try Fixture.small(kind)
        let engine = try Engine(fixture)
        let store = fixture.store
        try await withMount(store, configure: { $0.fileSystem.collectionInterval = nil }) { mount in
            mount.mount.fileSystem.holdBackgroundSaves(true)
            let m = mount.path
            let files = m + "/.Trash-\(getuid())/files"
            func count(_ what: String, _ call: @escaping @Sendable () throws -> Void) async throws -> Int {
                try await Self.transactions(store, what, call)
            }
            _ = try await count("a first look") {
                _ = try entries(in: files)
                _ = try entries(in: m + "/Work.pkg")
            }
            #expect(
                try await count("a document into the Trash") {
                    try Self.rename(m + "/Flat.txt", files + "/Flat.txt")
                } == 1)
            #expect(try engine.store.trash().map(\.name) == ["Flat.txt"])
            #expect(try !engine.documentNames().contains("Flat.txt"))
            // The package's unsaved changes of earlier calls are committed first, on their own.
            try writeText(m + "/Work.pkg/notes.txt", "changed before the move\n")
            mount.mount.fileSystem.saveAll(durable: false)
            #expect(
                try await count("a wrapper into the Trash") {
                    try Self.rename(m + "/Work.pkg/notes.txt", files + "/notes.txt")
                } == 1)
            #expect(try engine.store.trash().map(\.name).sorted() == ["Flat.txt", "notes.txt"])
            let item = try #require(try engine.store.trash().first { $0.name == "notes.txt" })
            let version = try #require(item.version)
            let itemNode = try #require(item.node)
            let record = try #require(try engine.store.node(itemNode, at: version))
            #expect(
                try engine.store.readContents(of: record.id, at: version, offset: 0, count: 100)
                    == Data("changed before the move\n".utf8), "the item has the bytes it had when moved")
            #expect(try engine.record("Work.pkg", "notes.txt") == nil)
            #expect(
                try await count("a restore") { try Self.rename(files + "/Flat.txt", m + "/Flat.txt") } == 1)
            #expect(try engine.text("Flat.txt") == Fixture.flatText)
            #expect(try await count("emptying an item") { _ = try sys(unlink(files + "/notes.txt")) } == 1)
            #expect(try engine.store.trash().isEmpty)
        }
    }

    @Test("keeping a conflict version and copying one are one transaction each", arguments: StoreKind.all)
    @MainActor
    func conflicts(_ kind: StoreKind) async throws {
        let (fixture, engine, work, flat) = try ConflictEntryTests.conflicted(kind)
        let store = fixture.store
        let flatVersion = try #require(flat)
        try await withMount(store, configure: { $0.fileSystem.collectionInterval = nil }) { mount in
            mount.mount.fileSystem.holdBackgroundSaves(true)
            let m = mount.path
            let workEntry = "Work (conflict \(work.rawValue)).pkg"
            let flatEntry = "Flat (conflict \(flatVersion.rawValue)).txt"
            _ = try entries(in: m)
            #expect(
                try await Self.transactions(store, "keep") {
                    try Self.rename(m + "/" + flatEntry, m + "/Flat.txt")
                } == 1)
            #expect(try engine.text("Flat.txt") == "flat lost\n")
            #expect(
                try await Self.transactions(store, "copy") {
                    try Self.rename(m + "/" + workEntry, m + "/Copy.pkg")
                } == 1)
            #expect(try engine.text("Copy.pkg", "notes.txt") == "lost\n")
            #expect(try engine.store.unresolvedConflicts().isEmpty)
        }
    }
}
