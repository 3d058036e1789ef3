import DocumentEngine
import SQLiteStore
import Foundation
import Testing
import TestSupport

/// `docfs retention`, `docfs gc` with the store's policy, and the collection `docfs` runs by
/// itself after import and restore.
@Suite("docfs retention")
struct RetentionCommandTests {
    let sandbox: Sandbox

    init() throws {
        sandbox = try Sandbox()
    }

    /// What `docfs retention` prints for the standard policy.
    static let standardLines = [
        "keep the newest 10 versions of each document",
        "keep every version of the last 1 hour",
        "then one per hour for 1 day",
        "then one per day for 30 days",
        "then one per week after that",
        "deleted documents go 30 days after deletion",
        "policy: last=10,all=1h,hourly=1d,daily=30d,weekly=forever,deleted=30d",
    ]

    /// What `docfs retention` prints for `current-only`.
    static let currentOnlyLines = [
        "keep the current version of each document",
        "no other versions are kept",
        "deleted documents go at the next collection",
        "policy: last=1,all=0,deleted=0",
    ]

    /// A new, empty store made by `docfs create`.
    func newStore(_ name: String = "Kept.docstore") throws -> String {
        let path = sandbox.path(name)
        let created = try sandbox.run(["create", path])
        try #require(created.status == 0, "\(created)")
        return path
    }

    /// A store with a flat document `n.txt` imported with "0" and then saved with "1" up to
    /// "\(saves)": `saves + 2` versions, since an import is two (the empty document, then its
    /// contents). All made through the engine, not `docfs`, so that no collection has run yet.
    func storeWithVersions(saves: Int) throws -> (path: String, document: DocumentID) {
        let path = try newStore()
        let store = try SQLiteStore(path: path)
        let info = try store.importItem(at: URL(fileURLWithPath: try sandbox.write("n.txt", Data("0".utf8))))
        for round in 0..<saves { try store.replaceContents(of: "n.txt", with: Data("\(round + 1)".utf8)) }
        try #require(try store.versions(of: info.id).count == saves + 2)
        return (path, info.id)
    }

    /// The version lines of `docfs versions STORE n.txt`, without the header.
    func versionLines(_ path: String) throws -> [String] {
        let listed = try sandbox.run(["versions", path, "n.txt"])
        try #require(listed.status == 0, "\(listed)")
        return Array(listed.lines.dropFirst())
    }

    @Test("retention shows the standard policy of a new store, in words and as text")
    func showsStandard() throws {
        let path = try newStore()
        let shown = try sandbox.run(["retention", path])
        #expect(shown.status == 0 && shown.stderr.isEmpty, "\(shown)")
        #expect(shown.lines == Self.standardLines, "\(shown)")

        // The default store, when no STORE is given.
        #expect(try sandbox.run(["create"]).status == 0)
        let byDefault = try sandbox.run(["retention"])
        #expect(byDefault.status == 0 && byDefault.lines == Self.standardLines, "\(byDefault)")
    }

    @Test("retention sets a policy, keeps it in the store and shows it back")
    func setsPolicy() throws {
        let path = try newStore()
        let set = try sandbox.run(["retention", path, "last=3,all=2h,daily=1w,deleted=0"])
        #expect(set.status == 0, "\(set)")
        let expected = [
            "keep the newest 3 versions of each document",
            "keep every version of the last 2 hours",
            "then one per day for 1 week",
            "older versions go",
            "deleted documents go at the next collection",
            "policy: last=3,all=2h,daily=1w,deleted=0",
        ]
        #expect(set.lines == expected, "\(set)")
        #expect(try sandbox.run(["retention", path]).lines == expected)
        #expect(
            try SQLiteStore(path: path).retentionPolicy()
                == RetentionPolicy(
                    keepLast: 3, keepAll: .seconds(7200), tiers: [.daily(for: .seconds(7 * 86_400))],
                    deletedDocumentsExpireAfter: .zero))

        // Tiers without a name, and a first tier by age.
        let every = try sandbox.run(["retention", path, "last=2,every=6h:for=2d,monthly=forever,deleted=forever"])
        #expect(
            every.lines == [
                "keep the newest 2 versions of each document",
                "keep one per 6 hours for the last 2 days",
                "then one per 30 days after that",
                "deleted documents are kept forever",
                "policy: last=2,all=0,every=6h:for=2d,monthly=forever,deleted=forever",
            ], "\(every)")

        // The shorthands, and the text forms they stand for.
        let currentOnly = try sandbox.run(["retention", path, "--current-only"])
        #expect(currentOnly.status == 0 && currentOnly.lines == Self.currentOnlyLines, "\(currentOnly)")
        #expect(try SQLiteStore(path: path).retentionPolicy() == .currentOnly)
        let standard = try sandbox.run(["retention", path, "--standard"])
        #expect(standard.status == 0 && standard.lines == Self.standardLines, "\(standard)")
        #expect(try SQLiteStore(path: path).retentionPolicy() == .standard)
        #expect(try sandbox.run(["retention", path, "current-only"]).lines == Self.currentOnlyLines)

        // A lone POLICY is for the default store.
        #expect(try sandbox.run(["create"]).status == 0)
        let lone = try sandbox.run(["retention", "current-only"])
        #expect(lone.status == 0 && lone.lines == Self.currentOnlyLines, "\(lone)")
        #expect(try SQLiteStore(path: sandbox.defaultStore).retentionPolicy() == .currentOnly)
        #expect(try SQLiteStore(path: path).retentionPolicy() == .currentOnly)
    }

    @Test(
        "retention refuses a bad policy with one line and exit 1, and leaves the store's as it was",
        arguments: [
            ("last=0", #"docfs: bad retention policy "last=0": last must be a whole number"#),
            ("hourly=12", #"docfs: bad retention policy "hourly=12": "12" in "12" has no unit"#),
            ("last=3,yearly=1w", #"docfs: bad retention policy "yearly=1w": unknown key "yearly""#),
            ("last=3,,all=1h", #"docfs: bad retention policy "": empty item"#),
            ("forever", #"docfs: bad retention policy "forever": expected key=value"#),
        ])
    func refusesBadPolicy(_ text: String, _ message: String) throws {
        let path = try newStore()
        #expect(try sandbox.run(["retention", path, "current-only"]).status == 0)
        let refused = try sandbox.run(["retention", path, text])
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.stdout.isEmpty, "\(refused)")
        #expect(refused.errorLines.count == 1, "\(refused)")
        #expect(refused.errorLines.first?.hasPrefix(message) == true, "\(refused)")
        #expect(try SQLiteStore(path: path).retentionPolicy() == .currentOnly)
    }

    @Test("retention refuses a shorthand with a POLICY, both shorthands, and extra arguments")
    func refusesBadUsage() throws {
        let path = try newStore()
        for arguments in [
            [path, "last=2", "--standard"], [path, "--standard", "--current-only"], [path, "last=2", "extra"],
        ] {
            let refused = try sandbox.run(["retention"] + arguments)
            #expect(refused.status != 0 && refused.stdout.isEmpty, "\(arguments): \(refused)")
        }
        #expect(try SQLiteStore(path: path).retentionPolicy() == .standard)
        let missing = try sandbox.run(["retention", sandbox.path("Missing.docstore")])
        #expect(missing.status == 1 && missing.errorLines.count == 1, "\(missing)")
        #expect(missing.errorLines.first?.hasPrefix("docfs: no store at ") == true, "\(missing)")
    }

    @Test("gc without options applies the store's policy")
    func gcAppliesStoredPolicy() throws {
        let path = try newStore()
        #expect(try sandbox.run(["import", path, try sandbox.write("n.txt", Data("0".utf8))]).status == 0)
        let store = try SQLiteStore(path: path)
        for round in 1...3 { try store.replaceContents(of: "n.txt", with: Data("\(round)".utf8)) }
        #expect(try versionLines(path).count == 5, "the import's two versions and three saves")

        // The standard policy keeps every version of the last hour.
        let standard = try sandbox.run(["gc", path])
        #expect(standard.status == 0 && standard.stdout.hasPrefix("removed 0 versions"), "\(standard)")
        #expect(try versionLines(path).count == 5)

        #expect(try sandbox.run(["retention", path, "current-only"]).status == 0)
        let collected = try sandbox.run(["gc", path])
        #expect(collected.status == 0 && collected.stdout.hasPrefix("removed 4 versions"), "\(collected)")
        let left = try versionLines(path)
        #expect(left.count == 1 && left.first?.hasPrefix("*") == true, "\(left)")
        let info = try #require(try store.document(named: "n.txt"))
        #expect(try store.wholeContents(of: info.root) == Data("3".utf8))
        #expect(try store.checkIntegrity().isClean)
    }

    @Test("gc --keep-last and --keep-for apply a one-off rule, not the store's policy")
    func gcOneOff() throws {
        let (path, document) = try storeWithVersions(saves: 3)
        #expect(try sandbox.run(["retention", path, "--current-only"]).status == 0)
        let store = try SQLiteStore(path: path)

        // --keep-for defaults to 30 days, which keeps every version here.
        let young = try sandbox.run(["gc", path, "--keep-last", "2"])
        #expect(young.status == 0 && young.stdout.hasPrefix("removed 0 versions"), "\(young)")
        #expect(try store.versions(of: document).count == 5)

        let pruned = try sandbox.run(["gc", path, "--keep-last", "2", "--keep-for", "0"])
        #expect(pruned.status == 0 && pruned.stdout.hasPrefix("removed 3 versions"), "\(pruned)")
        #expect(try store.versions(of: document).count == 2)
        #expect(try store.retentionPolicy() == .currentOnly, "a one-off rule leaves the store's policy")

        let zero = try sandbox.run(["gc", path, "--keep-last", "0"])
        #expect(zero.status != 0 && zero.stderr.contains("--keep-last must be at least 1"), "\(zero)")
        #expect(try store.versions(of: document).count == 2)
    }

    @Test("import applies the store's policy by itself, at most once an hour")
    func importCollects() throws {
        let (path, document) = try storeWithVersions(saves: 2)
        #expect(try sandbox.run(["retention", path, "current-only"]).status == 0)
        let store = try SQLiteStore(path: path)
        #expect(try store.versions(of: document).count == 4, "setting the policy collects nothing")

        let imported = try sandbox.run(
            ["import", path, try sandbox.write("other.txt", Data("x".utf8)), "--log-level", "debug"])
        #expect(imported.status == 0 && imported.stdout.hasPrefix("imported "), "\(imported)")
        #expect(imported.stderr.contains("collected garbage in the background"), "\(imported)")
        #expect(try store.versions(of: document).count == 1)
        #expect(try store.wholeContents(of: try #require(try store.document(named: "n.txt")).root) == Data("2".utf8))

        // Collected a moment ago: not due again within the hour.
        for round in 3...4 { try store.replaceContents(of: "n.txt", with: Data("\(round)".utf8)) }
        let again = try sandbox.run(
            ["import", path, try sandbox.write("third.txt", Data("y".utf8)), "--log-level", "debug"])
        #expect(again.status == 0, "\(again)")
        #expect(!again.stderr.contains("collected garbage in the background"), "\(again)")
        #expect(try store.versions(of: document).count == 3)
        #expect(try store.checkIntegrity().isClean)
    }

    @Test("restore applies the store's policy by itself")
    func restoreCollects() throws {
        let (path, document) = try storeWithVersions(saves: 1)
        #expect(try sandbox.run(["retention", path, "current-only"]).status == 0)
        let store = try SQLiteStore(path: path)
        // The import's second version, with "0" (its first is the empty document).
        let imported = try store.versions(of: document)[1].id

        let restored = try sandbox.run(["restore", path, "n.txt", "v\(imported.rawValue)"])
        #expect(restored.status == 0 && restored.stdout.hasPrefix("restored n.txt"), "\(restored)")
        let left = try store.versions(of: document)
        #expect(left.count == 1, "\(left)")
        let info = try #require(try store.document(named: "n.txt"))
        #expect(left.first?.id == info.currentVersion)
        #expect(try store.wholeContents(of: info.root) == Data("0".utf8))
    }

    @Test("undelete applies the store's policy by itself: other deleted documents go")
    func undeleteCollects() throws {
        let path = try newStore()
        let store = try SQLiteStore(path: path)
        for name in ["a.txt", "b.txt"] {
            let info = try store.importItem(at: URL(fileURLWithPath: try sandbox.write(name, Data(name.utf8))))
            try store.deleteDocument(info.id, origin: "RetentionCommandTests")
        }
        #expect(try store.deletedDocuments().count == 2)
        #expect(try sandbox.run(["retention", path, "current-only"]).status == 0)

        let undeleted = try sandbox.run(["restore", path, "a.txt", "--undelete"])
        #expect(undeleted.status == 0 && undeleted.stdout.hasPrefix("undeleted a.txt"), "\(undeleted)")
        #expect(try store.document(named: "a.txt") != nil)
        #expect(try store.deletedDocuments().isEmpty, "b.txt expired at once under current-only")
    }

    @Test("retention --help exits 0; gc --help points at it", arguments: [["retention"], ["gc"]])
    func help(_ command: [String]) throws {
        let result = try sandbox.run(command + ["--help"])
        #expect(result.status == 0 && result.stdout.contains("USAGE:"), "\(result)")
        let words = result.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")
        #expect(words.contains("`docfs retention`") || words.contains("USAGE: docfs retention"), "\(result)")
        let viaHelp = try sandbox.run(["help"] + command)
        #expect(viaHelp.status == 0, "\(viaHelp)")
    }
}
