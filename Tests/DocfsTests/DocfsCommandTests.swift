import DocumentEngine
import Foundation
import SQLiteStore
import SampleDocuments
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// The `docfs` command, run as a child process against stores in a private home.
@Suite("docfs command line")
struct DocfsCommandTests {
    let sandbox: Sandbox

    init() throws {
        sandbox = try Sandbox()
    }

    /// A store in the sandbox filled with the demo documents by `docfs create --demo`.
    func demoStore() throws -> String {
        let path = sandbox.path("Demo.docstore")
        let result = try sandbox.run(["create", path, "--demo"])
        try #require(result.status == 0, "\(result)")
        return path
    }

    @Test("create --demo makes the default store (0600 in 0700 folders); ls lists the 4 documents")
    @MainActor  // DemoDocuments' names are main-actor state
    func createDemoThenList() throws {
        let created = try sandbox.run(["create", "--demo"])
        #expect(created.status == 0, "\(created)")
        let path = sandbox.defaultStore
        #expect(FileManager.default.fileExists(atPath: path))
        #expect(permissions(path) == 0o600)
        #expect(permissions(sandbox.path("home/.local/share/docfs/Documents")) == 0o700)
        #expect(permissions(sandbox.path("home/.local/share/docfs")) == 0o700)

        let listed = try sandbox.run(["ls"])
        #expect(listed.status == 0, "\(listed)")
        #expect(listed.lines.count == 1 + DemoDocuments.names.count, "a header and one line each: \(listed)")
        for name in DemoDocuments.names {
            #expect(listed.lines.contains { $0.hasSuffix("  \(name)") }, "\(name) in \(listed.stdout)")
        }
        #expect(listed.lines.contains { $0.hasPrefix("package") && $0.hasSuffix("Things I Own.mystuff") })
        #expect(listed.lines.contains { $0.hasPrefix("flat") && $0.hasSuffix("README.txt") })
        #expect(try SQLiteStore(path: path).documents().map(\.name).sorted() == DemoDocuments.names.sorted())
    }

    @Test("create refuses an existing store; --demo on one adds only the missing demo documents")
    func createOnExistingStore() throws {
        let path = try demoStore()
        let again = try sandbox.run(["create", path])
        #expect(again.status == 1)
        #expect(
            again.errorLines == [
                "docfs: a store already exists at \(path); --demo adds the demo documents to it"
            ])

        let store = try SQLiteStore(path: path)
        let readme = try #require(try store.document(named: "README.txt"))
        try store.deleteDocument(readme.id, origin: "DocfsTests")
        let refill = try sandbox.run(["create", path, "--demo"])
        #expect(refill.status == 0, "\(refill)")
        #expect(refill.stdout == "added 1 demo document: README.txt\n")
        #expect(try store.documents().count == 4)

        let unchanged = try sandbox.run(["create", path, "--demo"])
        #expect(unchanged.status == 0 && unchanged.stdout == "the store already has the demo documents\n")
        let rechunk = try sandbox.run(["create", path, "--demo", "--chunk-size", "64K"])
        #expect(
            rechunk.status == 1 && rechunk.errorLines.first?.contains("cannot change") == true, "\(rechunk)")
    }

    @Test("create --chunk-size sets the store's chunk size")
    func createWithChunkSize() throws {
        let path = sandbox.path("nested/folders/Small.docstore")
        let result = try sandbox.run(["create", path, "--chunk-size", "64K"])
        #expect(result.status == 0, "\(result)")
        #expect(try SQLiteStore(path: path).chunkSize == 64 * 1024)
        #expect(permissions(sandbox.path("nested/folders")) == 0o700)
        let bad = try sandbox.run(["create", sandbox.path("Bad.docstore"), "--chunk-size", "lots"])
        #expect(bad.status != 0)
        #expect(!FileManager.default.fileExists(atPath: sandbox.path("Bad.docstore")))
    }

    @Test("ls DOCUMENT lists a package's wrappers like ls -l, and a flat document's one file")
    func listWrappers() throws {
        let path = try demoStore()
        let notes = try sandbox.run(["ls", path, "Trip Notes.imagenote"])
        #expect(notes.status == 0, "\(notes)")
        let store = try SQLiteStore(path: path)
        let info = try #require(try store.document(named: "Trip Notes.imagenote"))
        let records = try store.nodes(of: info.id).filter { $0.id != info.root }
        #expect(notes.lines.count == records.count)
        for record in records {
            let line = try #require(notes.lines.first { $0.hasSuffix(" \(record.name)") }, "\(record.name)")
            #expect(line.hasPrefix("-rw"), "\(line)")
            #expect(line.split(separator: " ", omittingEmptySubsequences: true)[1] == "\(record.size)")
        }

        let things = try sandbox.run(["ls", path, "Things I Own.mystuff"])
        #expect(things.status == 0)
        #expect(things.lines.contains { $0.hasSuffix(" things.data") })
        #expect(things.lines.filter { $0.contains("image.png") }.count == 4, "\(things.stdout)")

        let flat = try sandbox.run(["ls", path, "README.txt"])
        #expect(
            flat.status == 0 && flat.lines.count == 1 && flat.lines[0].hasSuffix(" README.txt"), "\(flat)")
    }

    @Test("ls takes a lone argument as a store when it has a / or ends in .docstore, else as a document")
    func listArgumentRule() throws {
        _ = try demoStore()
        // Relative, in the working directory: a store by its extension.
        let byExtension = try sandbox.run(["ls", "Demo.docstore"])
        #expect(byExtension.status == 0 && byExtension.lines.count == 5, "\(byExtension)")
        // No store at the default path, so a document name fails there, naming the default store.
        let asDocument = try sandbox.run(["ls", "README.txt"])
        #expect(asDocument.status == 1)
        #expect(asDocument.errorLines.first?.hasPrefix("docfs: no store at \(sandbox.defaultStore)") == true)
        #expect(try sandbox.run(["create", "--demo"]).status == 0)
        let inDefault = try sandbox.run(["ls", "README.txt"])
        #expect(inDefault.status == 0 && inDefault.lines.count == 1, "\(inDefault)")
        #expect(try sandbox.run(["ls", "a", "b", "c"]).status != 0)
    }

    @Test("versions lists every save; restore brings an old version back as a new save")
    func versionsAndRestore() throws {
        let path = sandbox.path("Notes.docstore")
        #expect(try sandbox.run(["create", path]).status == 0)
        let file = try sandbox.write("note.txt", Data("first words\n".utf8))
        let imported = try sandbox.run(["import", path, file, "--name", "Note.txt"])
        #expect(imported.status == 0, "\(imported)")

        let store = try SQLiteStore(path: path)
        try store.replaceContents(of: "Note.txt", with: Data("second, longer words\n".utf8))
        let info = try #require(try store.document(named: "Note.txt"))
        let history = try store.versions(of: info.id)
        #expect(history.count == 3, "created, imported, replaced")
        let importedVersion = history[1].id

        let listed = try sandbox.run(["versions", path, "Note.txt"])
        #expect(listed.status == 0, "\(listed)")
        #expect(listed.lines.count == 4, "a header and three versions: \(listed.stdout)")
        let current = listed.lines.filter { $0.hasPrefix("*") }
        #expect(current.count == 1)
        #expect(
            current.first?.split(separator: " ").dropFirst().first.map(String.init)
                == "\(info.currentVersion.rawValue)")
        #expect(current.first?.hasSuffix("DocfsTests") == true)

        let restored = try sandbox.run(["restore", path, "Note.txt", "\(importedVersion.rawValue)"])
        #expect(restored.status == 0, "\(restored)")
        let after = try #require(try store.document(named: "Note.txt"))
        #expect(after.currentVersion > info.currentVersion)
        #expect(try store.wholeContents(of: after.root) == Data("first words\n".utf8))
        #expect(try store.versions(of: after.id).count == 4)
        #expect(try store.versions(of: after.id).last?.origin == "docfs restore")

        // Export of an old version, with `v` as `docfs versions` might be read.
        let old = try sandbox.run([
            "export", path, "Note.txt", sandbox.path("old.txt"), "--at", "v\(history[2].id.rawValue)",
        ])
        #expect(old.status == 0, "\(old)")
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: sandbox.path("old.txt")))
                == Data("second, longer words\n".utf8))
    }

    @Test("a deleted document is listed by ls --deleted and versions, and restore --undelete brings it back")
    func undelete() throws {
        let path = try demoStore()
        let store = try SQLiteStore(path: path)
        let list = try #require(try store.document(named: "Shopping List.txt"))
        try store.deleteDocument(list.id, origin: "DocfsTests")

        let live = try sandbox.run(["ls", path])
        #expect(live.status == 0 && !live.stdout.contains("Shopping List.txt"))
        let deleted = try sandbox.run(["ls", path, "--deleted"])
        #expect(
            deleted.status == 0 && deleted.lines.count == 2
                && deleted.lines[1].hasSuffix("Shopping List.txt"), "\(deleted)")
        let versions = try sandbox.run(["versions", path, "Shopping List.txt"])
        #expect(versions.status == 0 && versions.lines.count >= 2, "\(versions)")
        #expect(versions.stderr.contains("deleted"))

        let back = try sandbox.run(["restore", path, "Shopping List.txt", "--undelete"])
        #expect(back.status == 0, "\(back)")
        let info = try #require(try store.document(named: "Shopping List.txt"))
        #expect(try store.wholeContents(of: info.root) == Data("milk\neggs\nbread\n".utf8))
        let none = try sandbox.run(["restore", path, "Shopping List.txt", "--undelete"])
        #expect(
            none.status == 1 && none.errorLines == ["docfs: no deleted document named \"Shopping List.txt\""])
    }

    @Test("fsck: 0 on a healthy store, 1 naming a damaged chunk, 2 on a store it cannot use")
    func fsck() throws {
        let path = try demoStore()
        let clean = try sandbox.run(["fsck", path])
        #expect(clean.status == 0, "\(clean)")
        #expect(clean.stdout.contains("clean"))

        try sqlite(path, "UPDATE chunks SET data = zeroblob(10) WHERE id = 1")
        let damaged = try sandbox.run(["fsck", path])
        #expect(damaged.status == 1, "\(damaged)")
        #expect(damaged.lines.contains { $0.hasPrefix("chunk 1:") }, "\(damaged.stdout)")
        #expect(damaged.errorLines.count == 1 && damaged.errorLines[0].hasPrefix("docfs: "))

        let missing = try sandbox.run(["fsck", sandbox.path("Missing.docstore")])
        #expect(
            missing.status == 2 && missing.errorLines.count == 1 && missing.errorLines[0].hasPrefix("docfs: ")
        )
        let foreign = try sandbox.write("foreign.docstore", Data("not a database at all\n".utf8))
        let notAStore = try sandbox.run(["fsck", foreign])
        #expect(notAStore.status == 2 && notAStore.errorLines.first?.contains("is not a DocFS store") == true)
    }

    @Test("import then export is byte-identical, with modes, links and nested folders")
    func importExportRoundTrip() throws {
        let path = sandbox.path("Files.docstore")
        #expect(try sandbox.run(["create", path, "--chunk-size", "64K"]).status == 0)
        let big = sampleBytes(300_000, seed: 1)  // several chunks, the last one partial
        let files: [String: Data] = [
            "in/a.txt": Data("hello\n".utf8), "in/sub/big.bin": big, "in/sub/deeper/empty": Data(),
        ]
        for (name, data) in files { try sandbox.write(name, data) }
        #expect(chmod(sandbox.path("in/a.txt"), 0o640) == 0)
        #expect(symlink("a.txt", sandbox.path("in/link")) == 0)

        let imported = try sandbox.run(["import", path, sandbox.path("in"), "--name", "Files.pkg"])
        #expect(imported.status == 0, "\(imported)")
        let listed = try sandbox.run(["ls", path, "Files.pkg"])
        #expect(listed.lines.contains { $0.hasPrefix("drwx") && $0.hasSuffix(" sub") }, "\(listed.stdout)")
        #expect(listed.lines.contains { $0.hasPrefix("-rw-r-----") && $0.hasSuffix(" a.txt") })
        #expect(listed.lines.contains { $0.hasPrefix("lrwx") && $0.hasSuffix(" link -> a.txt") })
        #expect(listed.lines.contains { $0.contains(" 300000 ") && $0.hasSuffix(" sub/big.bin") })
        #expect(listed.lines.contains { $0.hasSuffix(" sub/deeper/empty") })

        let exported = try sandbox.run(["export", path, "Files.pkg", sandbox.path("out")])
        #expect(exported.status == 0, "\(exported)")
        for (name, data) in files {
            let copy = sandbox.path("out" + name.dropFirst(2))
            #expect(try Data(contentsOf: URL(fileURLWithPath: copy)) == data, "\(name)")
        }
        #expect(permissions(sandbox.path("out/a.txt")) == 0o640)
        #expect(
            try FileManager.default.destinationOfSymbolicLink(atPath: sandbox.path("out/link")) == "a.txt")

        // A flat document, exported into an existing folder under its own name.
        let flatFile = try sandbox.write("big.bin", big)
        #expect(try sandbox.run(["import", path, flatFile]).status == 0)
        try FileManager.default.createDirectory(
            atPath: sandbox.path("into"), withIntermediateDirectories: false)
        let into = try sandbox.run(["export", path, "big.bin", sandbox.path("into")])
        #expect(into.status == 0, "\(into)")
        #expect(try Data(contentsOf: URL(fileURLWithPath: sandbox.path("into/big.bin"))) == big)
        // An existing item is replaced only with --force.
        let again = try sandbox.run(["export", path, "big.bin", sandbox.path("into")])
        #expect(again.status == 1 && again.errorLines.first?.contains("already exists") == true, "\(again)")
        #expect(try sandbox.run(["export", path, "big.bin", sandbox.path("into"), "--force"]).status == 0)
        #expect(try SQLiteStore(path: path).checkIntegrity().isClean)
    }

    @Test("gc drops versions beyond --keep-last and older than --keep-for")
    func collectGarbage() throws {
        let path = sandbox.path("Old.docstore")
        #expect(try sandbox.run(["create", path]).status == 0)
        #expect(try sandbox.run(["import", path, try sandbox.write("n.txt", Data("0".utf8))]).status == 0)
        let store = try SQLiteStore(path: path)
        for round in 1...3 { try store.replaceContents(of: "n.txt", with: Data("\(round)".utf8)) }
        let info = try #require(try store.document(named: "n.txt"))
        #expect(try store.versions(of: info.id).count == 5)

        let kept = try sandbox.run(["gc", path, "--keep-last", "2", "--keep-for", "30d"])
        #expect(kept.status == 0, "\(kept)")
        #expect(try store.versions(of: info.id).count == 5, "all are younger than 30 days")
        let pruned = try sandbox.run(["gc", path, "--keep-last", "2", "--keep-for", "0"])
        #expect(pruned.status == 0 && pruned.stdout.hasPrefix("removed 3 versions"), "\(pruned)")
        #expect(try store.versions(of: info.id).count == 2)
        #expect(try store.wholeContents(of: info.root) == Data("3".utf8))

        for bad in [["--keep-for", "3x"], ["--keep-for", "12"], ["--keep-last", "0"]] {
            let result = try sandbox.run(["gc", path] + bad)
            #expect(result.status != 0, "\(bad)")
        }
        #expect(try sandbox.run(["gc", path, "--keep-for", "1d12h"]).status == 0)
    }

    @Test(
        "plist prints an archive from the store, converts it to XML and back, and names the line of bad text")
    func propertyLists() throws {
        let store = try demoStore()
        let printed = try sandbox.run(["plist", store, "Things I Own.mystuff/things.data"])
        #expect(printed.status == 0, "\(printed)")
        #expect(
            printed.stdout.contains("NSKeyedArchiver") && printed.stdout.contains("Guitar"),
            "\(printed.stdout)")

        let xml = sandbox.path("things.xml")
        let converted = try sandbox.run([
            "plist", store, "Things I Own.mystuff/things.data", "--xml", "-o", xml,
        ])
        #expect(converted.status == 0, "\(converted)")
        let text = try String(contentsOfFile: xml, encoding: .utf8)
        #expect(
            text.hasPrefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>")
                && text.contains("<string>Guitar</string>"))
        try text.replacingOccurrences(of: "<string>Guitar</string>", with: "<string>Banjo</string>")
            .write(toFile: xml, atomically: true, encoding: .utf8)
        let binary = sandbox.path("things.bin")
        let back = try sandbox.run(["plist", xml, "--binary", "-o", binary])
        #expect(back.status == 0, "\(back)")
        let bytes = try Data(contentsOf: URL(fileURLWithPath: binary))
        #expect(PropertyList.isBinary(bytes))
        let names = try KeyedArchive.unarchivedObject(
            ofClasses: [NSArray.self, MyWhatsit.self], from: bytes, classNames: ["MyWhatsit": MyWhatsit.self])
        #expect((names as? [MyWhatsit])?.map(\.name) == ["Bicycle", "Banjo", "Telescope", "Kayak"])

        let bad = sandbox.path("bad.plist")
        try
            "<?xml version=\"1.0\"?>\n<plist version=\"1.0\">\n<dict>\n\t<key>a</key>\n\t<integr>1</integr>\n</dict>\n</plist>\n"
            .write(toFile: bad, atomically: true, encoding: .utf8)
        let refused = try sandbox.run(["plist", bad, "--binary"])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("line 5"), "\(refused.stderr)")

        let broken = text.replacingOccurrences(of: "<key>$top</key>", with: "<key>$tip</key>")
        try broken.write(toFile: bad, atomically: true, encoding: .utf8)
        let notArchive = try sandbox.run(["plist", bad, "--binary"])
        #expect(notArchive.status == 1)
        #expect(notArchive.stderr.contains("not a keyed archive"), "\(notArchive.stderr)")
    }

    @Test("--log-level debug logs on standard error")
    func logLevel() throws {
        let path = try demoStore()
        let quiet = try sandbox.run(["ls", path])
        #expect(quiet.stderr.isEmpty)
        let chatty = try sandbox.run(["ls", path, "--log-level", "debug"])
        #expect(chatty.status == 0 && chatty.stderr.contains("opening the store"), "\(chatty)")
    }

    @Test(
        "--help of every command exits 0",
        arguments: [
            [], ["create"], ["ls"], ["versions"], ["restore"], ["fsck"], ["import"], ["export"], ["gc"],
        ])
    func help(_ command: [String]) throws {
        let result = try sandbox.run(command + ["--help"])
        #expect(result.status == 0, "\(result)")
        #expect(result.stdout.contains("USAGE:"))
        let viaHelp = try sandbox.run(["help"] + command)
        #expect(viaHelp.status == 0, "\(viaHelp)")
    }

    @Test("--version prints the version")
    func version() throws {
        let result = try sandbox.run(["--version"])
        #expect(result.status == 0)
        #expect(
            result.stdout.range(of: #"^\d+\.\d+\.\d+\n$"#, options: .regularExpression) != nil, "\(result)")
    }
}

/// The progress bar of import and export, which draws only on a terminal.
@Suite("docfs progress")
struct DocfsProgressTests {
    @Test(
        "import and export draw a progress bar on a terminal, and end its line",
        .enabled(if: FileManager.default.isExecutableFile(atPath: "/usr/bin/script")))
    func progressOnATerminal() throws {
        let sandbox = try Sandbox()
        let program = try #require(Docfs.program)
        let store = sandbox.path("Bar.docstore")
        #expect(try sandbox.run(["create", store]).status == 0)
        let file = try sandbox.write("big.bin", sampleBytes(1_000_000, seed: 3))
        // script(1) gives the command a pseudo-terminal; its output is what the terminal shows.
        for command in [
            "\(program.path) import \(store) \(file)",
            "\(program.path) export \(store) big.bin \(sandbox.path("out.bin"))",
        ] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: "/usr/bin/script")
            process.arguments = ["-q", "-e", "-c", command, "/dev/null"]
            process.environment = sandbox.environment
            let output = Pipe()
            process.standardOutput = output
            process.standardInput = FileHandle.nullDevice
            try process.run()
            let data = output.fileHandleForReading.readDataToEndOfFile()
            process.waitUntilExit()
            let text = String(decoding: data, as: UTF8.self)
            #expect(process.terminationStatus == 0, "\(command): \(text)")
            #expect(text.contains("ing [") && text.contains("100%"), "\(text.debugDescription)")
            // The summary starts a line of its own after the bar.
            #expect(
                text.contains("\n" + (command.contains(" import ") ? "imported " : "exported ")),
                "\(text.debugDescription)")
        }
        #expect(
            try Data(contentsOf: URL(fileURLWithPath: sandbox.path("out.bin")))
                == sampleBytes(1_000_000, seed: 3))
    }
}
