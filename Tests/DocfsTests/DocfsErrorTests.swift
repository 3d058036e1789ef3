import DocumentEngine
import Foundation
import Testing
import VersionedStore

@testable import SQLiteStore

#if canImport(Glibc)
    import Glibc
#endif

/// Every failure is one line on standard error, `docfs: <message>`, and a non-zero exit; never
/// a stack trace or a dump of an error value.
@Suite("docfs errors")
struct DocfsErrorTests {
    let sandbox: Sandbox
    let store: String

    init() throws {
        sandbox = try Sandbox()
        store = sandbox.path("Demo.docstore")
        let created = try sandbox.run(["create", store, "--demo"])
        try #require(created.status == 0, "\(created)")
    }

    /// Runs `arguments` and checks the failure's form and that its message contains `expected`.
    func expectFailure(
        _ arguments: [String], _ expected: String, prefix: [String] = [],
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let result = try sandbox.run(arguments, prefix: prefix)
        #expect(result.status != 0, "\(arguments): \(result)", sourceLocation: sourceLocation)
        #expect(result.errorLines.count == 1, "one line: \(result)", sourceLocation: sourceLocation)
        #expect(result.stderr.hasPrefix("docfs: "), "\(result)", sourceLocation: sourceLocation)
        #expect(result.stderr.contains(expected), "\(arguments): \(result)", sourceLocation: sourceLocation)
        #expect(result.stdout.isEmpty, "\(result)", sourceLocation: sourceLocation)
    }

    @Test("a missing store, named or default")
    func missingStore() throws {
        try expectFailure(
            ["ls", sandbox.path("Missing.docstore")], "no store at \(sandbox.path("Missing.docstore"))")
        try expectFailure(["ls"], "no store at \(sandbox.defaultStore); create one with `docfs create`")
        try expectFailure(["versions", "README.txt"], "no store at")
        try expectFailure(["import", sandbox.path("Missing.docstore"), store], "no store at")
    }

    @Test("a file that is not a store: text, another application's database, a folder")
    func notAStore() throws {
        let text = try sandbox.write(
            "notes.docstore", Data("just some text, long enough to be more than a header\n".utf8))
        try expectFailure(["ls", text], "is not a DocFS store: it is not an SQLite database")
        let foreign = sandbox.path("foreign.docstore")
        try sqlite(foreign, "CREATE TABLE t(x); INSERT INTO t VALUES (1);")
        try expectFailure(
            ["ls", foreign], "is not a DocFS store: it is another application's SQLite database")
        #expect(try sqlite(foreign, "SELECT x FROM t;") == "1\n", "the foreign database is untouched")
        try expectFailure(["ls", sandbox.path("")], "is not a DocFS store: it is not a regular file")
    }

    @Test("a truncated or damaged store")
    func corruptStore() throws {
        let truncated = try sandbox.write(
            "truncated.docstore", Data("SQLite format 3\0".utf8) + Data(count: 40))
        try expectFailure(["ls", truncated], "is damaged: the file is truncated")
        try expectFailure(["create", truncated, "--demo"], "is damaged")
    }

    @Test("a store from a newer DocFS")
    func newerFormat() throws {
        try sqlite(store, "UPDATE store_meta SET value = 99 WHERE key = 'format';")
        try expectFailure(["ls", store], "has format 99, newer than this program's")
    }

    @Test("no such document, no such version")
    func noSuchDocumentOrVersion() throws {
        try expectFailure(["ls", store, "Nothing.txt"], "no such document: Nothing.txt")
        try expectFailure(["versions", store, "Nothing.txt"], "no such document: Nothing.txt")
        try expectFailure(["restore", store, "Nothing.txt", "1"], "no such document: Nothing.txt")
        try expectFailure(
            ["export", store, "Nothing.txt", sandbox.path("out")], "no such document: Nothing.txt")
        try expectFailure(["restore", store, "README.txt", "999999"], "no such version: version 999999")
        try expectFailure(
            ["export", store, "README.txt", sandbox.path("out"), "--at", "999999"], "no such version")
        // A version of another document is not this one's.
        let other = try SQLiteStore(path: store)
        let trip = try #require(try other.document(named: "Trip Notes.imagenote"))
        try expectFailure(
            ["restore", store, "README.txt", "\(trip.currentVersion.rawValue)"], "no such version")
    }

    @Test("an invalid name, a name in use, a path that does not exist")
    func names() throws {
        let file = try sandbox.write("file.txt", Data("x".utf8))
        try expectFailure(
            ["import", store, file, "--name", "a/b"], "invalid name \"a/b\": it contains a slash")
        try expectFailure(["import", store, file, "--name", ".."], "invalid name \"..\"")
        try expectFailure(
            ["import", store, file, "--name", "README.txt"], "a document named \"README.txt\" already exists")
        try expectFailure(
            ["import", store, sandbox.path("nowhere")], "cannot read \(sandbox.path("nowhere"))")
        #expect(try SQLiteStore(path: store).documents().count == 4, "no half-imported documents")
    }

    @Test("an intent log a killed process left that cannot be saved: fsck names it, mount refuses")
    func unsavableIntentLog() throws {
        try FileManager.default.createDirectory(atPath: store + "-intents", withIntermediateDirectories: true)
        // Whole by its checksums, but not a record this DocFS can read (as a newer one's).
        let log = store + "-intents/00000000000000ab.log"
        try IntentLog.record(
            epoch: 1, sequence: 1, kind: .changes, payload: Data([0xFF, 0xFF, 0xFF, 0xFF, 9])
        )
        .write(to: URL(fileURLWithPath: log))
        let fsck = try sandbox.run(["fsck", store])
        #expect(fsck.status == 1, "\(fsck)")
        #expect(fsck.stdout.contains("intent log not saved yet") && fsck.stdout.contains("ab.log"), "\(fsck)")
        let mountpoint = sandbox.path("mnt")
        try FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: true)
        try expectFailure(["mount", store, mountpoint], "cannot save the changes a killed process logged")
        #expect(FileManager.default.fileExists(atPath: log), "the log stays for the next opening")
    }

    @Test("permission denied")
    func permissionDenied() throws {
        // Root reads anything, so as root the command runs as nobody (setpriv); otherwise the
        // store is made unreadable.
        var prefix: [String] = []
        if getuid() == 0 {
            guard FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") else {
                Issue.record("running as root without setpriv: cannot test permissions")
                return
            }
            prefix = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
            // nobody may enter the sandbox, but not read the (0600, root's) store.
            #expect(chmod(sandbox.path, 0o755) == 0)
        } else {
            #expect(chmod(store, 0) == 0)
        }
        try expectFailure(["ls", store], "permission denied", prefix: prefix)
        try expectFailure(["fsck", store], "permission denied", prefix: prefix)
    }
}
