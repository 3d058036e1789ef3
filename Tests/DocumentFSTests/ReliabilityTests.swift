import DocumentEngine
import DocumentFS
import Foundation
import PostgresStore
import SQLiteStore
import StoreTestSupport
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Short forms of the reliability checks (the long forms are scripts/fsx.sh,
/// scripts/crash-test.sh and scripts/concurrency.sh): random operations checked against a model,
/// many writers at once, a daemon killed mid-write, unmount while busy.
@Suite(.serialized) struct ReliabilityTests {
    /// The repository's root (for the scripts).
    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// A program built next to the test bundle by `swift build --build-tests`.
    static func builtProgram(_ name: String) -> String? {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
            Bundle.main.bundleURL,
            Bundle.main.bundleURL.deletingLastPathComponent(),
        ]
        return candidates.map { $0.appendingPathComponent(name).path }.first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }

    static func seed(_ variable: String) -> UInt64 {
        ProcessInfo.processInfo.environment[variable].flatMap { UInt64($0) } ?? UInt64.random(in: 1...999_999)
    }

    /// Every file of `modelDirectory` (no subfolders) equals the wrapper of that name in
    /// `document` (nil: the flat documents of those names), and `document` has no other
    /// wrappers named `prefix*`.
    static func expectStore(
        _ fixture: Fixture, matches modelDirectory: String, in document: String?, prefix: String,
        context: String
    ) throws {
        let engine = try Engine(fixture)
        let model = try FileManager.default.contentsOfDirectory(atPath: modelDirectory).sorted()
        let stored: [String]
        if let document {
            stored = try engine.paths(document).filter { $0.hasPrefix(prefix) }
        } else {
            stored = try engine.documentNames().filter { $0.hasPrefix(prefix) }
        }
        #expect(stored == model, "\(context): the store's files")
        for name in model {
            let want = try Data(contentsOf: URL(fileURLWithPath: modelDirectory + "/" + name))
            let got = try document.map { try engine.contents($0, name) } ?? engine.contents(name)
            #expect(
                got == want,
                "\(context): \(name) in the store: \(got?.count ?? -1) bytes, model \(want.count)")
        }
        let report = try engine.store.checkIntegrity()
        #expect(report.isClean, "\(report.problems)")
    }

    // MARK: fsx

    /// scripts/reliability/fsx.py in a package (2500 operations): write, read, truncate, writes
    /// through a shared mmap, fallocate (3 modes), rename (also onto an open file), unlink while
    /// open, fsync, close/reopen, each checked against a model; then, after unmount, a second
    /// SQLiteStore on the file must hold exactly the model's final files. `DOCFS_FSX_SEED`
    /// repeats a run.
    @Test func randomOperationsMatchTheModel() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let seed = Self.seed("DOCFS_FSX_SEED")
        let models = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: models) }
        print("fsx: seed \(seed) (DOCFS_FSX_SEED repeats it)")
        let script = Self.root + "/scripts/reliability/fsx.py"
        try await withMount(fixture.store) { mount in
            let inPackage = try await offThread {
                try runTimed(
                    "/usr/bin/python3",
                    [script, mount.url("Work.pkg"), "\(seed)", "2500", "--model-out", models + "/package"],
                    seconds: 120)
            }
            #expect(
                inPackage.status == 0,
                "fsx in a package, seed \(seed):\n\(inPackage.output)\(inPackage.error)")
            print(inPackage.output.split(separator: "\n").first ?? "")
        }
        try Self.expectStore(
            fixture, matches: models + "/package", in: "Work.pkg", prefix: "fsx\(seed % 1000)-",
            context: "fsx seed \(seed)")
    }

    /// fsx at the mount root, where every file is a flat document: the same operations. (It
    /// found the stale-listing rename bug below: about 1 run in 3 of 1000 operations failed,
    /// e.g. seed 382796, with ENOENT on a name just renamed to, or a wrong size.)
    @Test func randomOperationsAtTheRootMatchTheModel() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let seed = Self.seed("DOCFS_FSX_SEED")
        let models = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: models) }
        print("fsx at the root: seed \(seed) (DOCFS_FSX_SEED repeats it)")
        let script = Self.root + "/scripts/reliability/fsx.py"
        let atRoot = try await withMount(fixture.store) { mount in
            try await offThread {
                try runTimed(
                    "/usr/bin/python3",
                    [script, mount.path, "\(seed)", "1000", "--model-out", models + "/root"],
                    seconds: 120)
            }
        }
        print(atRoot.output.split(separator: "\n").first ?? "")
        #expect(atRoot.status == 0, "fsx at the root, seed \(seed):\n\(atRoot.output)\(atRoot.error)")
        if atRoot.status == 0 {
            try Self.expectStore(
                fixture, matches: models + "/root", in: nil, prefix: "fsx\(seed % 1000)-",
                context: "fsx seed \(seed)")
        }
    }

    /// Found by fsx at the root: the mount's refresh of the root listing (on a store event)
    /// reconciled a listing read before a rename of this mount's own, so the new name vanished
    /// and the old one came back until the next refresh. Here the listing is made slow so that
    /// the second rename lands while the refresh of the first holds a stale listing.
    @Test func aRenameDuringARefreshOfTheListingKeepsItsName() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        try await withMount(proxy) { mount in
            try await offThread { try writeText(mount.url("A.txt"), "a\n") }
            try await Task.sleep(for: .milliseconds(500))
            proxy.listingDelay.store(600, ordering: .relaxed)
            let missing = try await offThread { () throws -> [String] in
                try sys(rename(mount.url("A.txt"), mount.url("B.txt")), "rename A B")
                usleep(250_000)
                try sys(rename(mount.url("B.txt"), mount.url("C.txt")), "rename B C")
                var missing: [String] = []
                let start = Date()
                while Date().timeIntervalSince(start) < 1.6 {
                    var st = stat()
                    if stat(mount.url("C.txt"), &st) != 0 {
                        missing.append(
                            String(format: "%.2f s after the rename", Date().timeIntervalSince(start)))
                    }
                    usleep(20_000)
                }
                return missing
            }
            proxy.listingDelay.store(0, ordering: .relaxed)
            #expect(missing.isEmpty, "C.txt was missing: \(missing.prefix(3)) (\(missing.count) times)")
            #expect(try entries(in: mount.path).filter { $0.hasSuffix(".txt") } == ["C.txt", "Flat.txt"])
        }
    }

    /// Found by the power-loss suite on PostgreSQL: a refresh of the root listing (on the
    /// mount's own store event) read a document this mount had just restored from the Trash,
    /// before the restore's own update of the view, and installed it; the restore installed it
    /// again. The first node kept the old name after a rename, a scratch file published onto
    /// that name became the renamed document's contents, and the name published was in no
    /// version. Here each commit waits before the view is updated, so the refresh comes first.
    @Test func aDocumentRestoredWhileTheListingIsRefreshedIsShownOnce() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let proxy = ProxyStore(fixture.store)
        try await withMount(proxy) { mount in
            let m = mount.path
            let files = m + "/.Trash-\(getuid())/files"
            try await offThread {
                _ = try entries(in: files)
                try sys(rename(m + "/Flat.txt", files + "/Flat.txt"), "rename into the Trash")
            }
            try await Task.sleep(for: .milliseconds(300))
            proxy.commitDelay.store(800, ordering: .relaxed)
            try await offThread {
                try sys(rename(files + "/Flat.txt", m + "/Flat.txt"), "restore")
                try sys(rename(m + "/Flat.txt", m + "/Moved.txt"), "rename")
            }
            proxy.commitDelay.store(0, ordering: .relaxed)
            try await offThread {
                try writeText(m + "/.#Flat.txt", "published\n")
                try sys(rename(m + "/.#Flat.txt", m + "/Flat.txt"), "publish")
            }
            mount.mount.fileSystem.saveAll(durable: false)
            #expect(try entries(in: m).filter { $0.hasSuffix(".txt") } == ["Flat.txt", "Moved.txt"])
            #expect(try readText(m + "/Moved.txt") == Fixture.flatText)
            #expect(try readText(m + "/Flat.txt") == "published\n")
            let engine = try Engine(fixture)
            try await expectEventually("the store has both names") {
                try engine.documentNames().contains("Flat.txt")
            }
            #expect(try engine.text("Moved.txt") == Fixture.flatText)
            #expect(try engine.text("Flat.txt") == "published\n")
        }
    }

    // MARK: Concurrency

    /// scripts/reliability/concurrency.py: 3 processes × 4 threads rewriting their own slots of
    /// one shared file, their own files in a shared package, their own packages and flat
    /// documents, and reading each other's; no lost update (checked through the mount and, after
    /// unmount, in the store), no operation slower than 20 s, no hang (the mount's watchdog and
    /// the child's timeout).
    @Test func manyWritersLoseNothing() async throws {
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let seed = Self.seed("DOCFS_CONCURRENCY_SEED")
        let expected = try localDirectory()
        defer { try? FileManager.default.removeItem(atPath: expected) }
        let script = Self.root + "/scripts/reliability/concurrency.py"
        try await withMount(fixture.store) { mount in
            let result = try await offThread {
                try runTimed(
                    "/usr/bin/python3",
                    [script, mount.path, "\(seed)", "3", "4", "25", "--expect", expected],
                    seconds: 120)
            }
            print(result.output)
            #expect(result.status == 0, "concurrency seed \(seed):\n\(result.output)\(result.error)")
        }
        try Self.expectStore(
            fixture, matches: expected + "/Shared.pkg", in: "Shared.pkg", prefix: "",
            context: "concurrency seed \(seed)")
        let engine = try Engine(fixture)
        for p in 0..<3 {
            for t in 0..<4 {
                let tag = "p\(p)t\(t)"
                let own = try Data(contentsOf: URL(fileURLWithPath: "\(expected)/Own-\(tag).pkg/own.txt"))
                #expect(try engine.contents("Own-\(tag).pkg", "own.txt") == own, "Own-\(tag).pkg/own.txt")
                let flat = try Data(contentsOf: URL(fileURLWithPath: "\(expected)/Flat-\(tag).txt"))
                #expect(try engine.contents("Flat-\(tag).txt") == flat, "Flat-\(tag).txt")
            }
        }
    }

    // MARK: The daemon

    /// `docfs mount -f` as a child (under `timeout`); returns the process once the mount is up.
    static func startDaemon(_ docfs: String, store: String, at mountpoint: String) throws -> Process {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = timedCommand(docfs, ["mount", "-f", store, mountpoint], seconds: 120)
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        try process.run()
        guard eventually(timeout: 10, { isMounted(mountpoint) }) != nil else {
            process.terminate()
            throw TestFailure("docfs mount -f never mounted \(mountpoint)")
        }
        return process
    }

    /// `fusermount3 -u` while a file is open answers EBUSY and leaves the mount serving; `-z`
    /// detaches it at once, the daemon keeps serving the open file, and when that file is
    /// closed the daemon saves everything and exits 0.
    @Test func unmountWhileBusy() async throws {
        guard let docfs = Self.builtProgram("docfs") else {
            Issue.record("docfs is not built next to the tests; run `swift build --build-tests`")
            return
        }
        let fixture = try Fixture.small()
        defer { fixture.remove() }
        let mountpoint = try temporaryDirectory("docfs-mnt")
        defer { rmdir(mountpoint) }
        let daemon = try Self.startDaemon(docfs, store: fixture.path, at: mountpoint)
        var detached = false
        defer {
            if !detached, isMounted(mountpoint) {
                _ = try? runTimed("/bin/fusermount3", ["-u", "-z", mountpoint])
            }
            if daemon.isRunning { kill(daemon.processIdentifier, SIGKILL) }
        }
        try await offThread {
            try writeText(mountpoint + "/Work.pkg/closed.txt", "closed before the unmount\n")
        }
        let holder = try await offThread {
            try FileHolder(mountpoint + "/Work.pkg/open.txt", flags: "O_RDWR|O_CREAT")
        }
        defer { holder.stop() }
        try await offThread { try holder.send("write first") }

        let busy = try await offThread { try runTimed("/bin/fusermount3", ["-u", mountpoint], seconds: 20) }
        #expect(busy.status != 0, "fusermount3 -u with an open file")
        #expect(busy.error.contains("busy"), "\(busy.error)")
        #expect(isMounted(mountpoint))
        #expect(
            try await offThread {
                try String(contentsOfFile: mountpoint + "/Work.pkg/closed.txt", encoding: .utf8)
            }
                == "closed before the unmount\n")

        let lazy = try await offThread {
            try runTimed("/bin/fusermount3", ["-u", "-z", mountpoint], seconds: 20)
        }
        #expect(lazy.status == 0, "\(lazy.error)")
        detached = true
        #expect(!isMounted(mountpoint))
        // Still served through the open descriptor.
        try await offThread { try holder.send("write second, after the lazy unmount") }
        #expect(daemon.isRunning, "the daemon waits for the open file")
        try await offThread { try holder.send("close") }
        let exited = try await waitUntil(timeout: 20) { !daemon.isRunning }
        #expect(exited != nil, "the daemon did not exit after the last file closed")
        if exited != nil {
            #expect(daemon.terminationStatus == 0)
        }
        let engine = try Engine(fixture)
        #expect(try engine.text("Work.pkg", "closed.txt") == "closed before the unmount\n")
        #expect(try engine.text("Work.pkg", "open.txt") == "second, after the lazy unmount")
        #expect(try engine.store.checkIntegrity().isClean)
    }

    /// scripts/crash-test.sh, short: 4 rounds of 3 writers against `docfs mount -f`, killed
    /// with SIGKILL 0.3–3 s into each round; then fsck, every fsync-acknowledged record present,
    /// no file half-saved, and the store mounts again. `DOCFS_CRASH_SEED` repeats a run.
    /// On PostgreSQL (`DOCFS_STORE`, a fresh database) the killed daemon's connections drop
    /// mid-transaction.
    @Test(arguments: StoreKind.all)
    func aKilledDaemonLosesNothingAcknowledged(_ kind: StoreKind) async throws {
        guard let docfs = Self.builtProgram("docfs") else {
            Issue.record("docfs is not built next to the tests; run `swift build --build-tests`")
            return
        }
        let seed = Self.seed("DOCFS_CRASH_SEED") % 100_000
        var environment = ["DOCFS_BIN=\(docfs)"]
        let database = kind == .postgres ? try StoreFixture.newDatabase() : nil
        defer { if let database { try? PostgresStore.dropDatabase(database) } }
        if let database { environment.append("DOCFS_STORE=\(database.url)") }
        let variables = environment
        let result = try await offThread {
            try runTimed(
                "/usr/bin/env", variables + [Self.root + "/scripts/crash-test.sh", "4", "\(seed)", "3"],
                seconds: 150)
        }
        print(result.output)
        #expect(result.status == 0, "crash-test seed \(seed):\n\(result.output)\(result.error)")
    }
}
