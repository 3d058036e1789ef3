import DocumentEngine
import Foundation
import PostgresStore
import StoreTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

// Serialized: fewer mounts coming and going at once (each `docfs mount` reads mountinfo).
/// One PostgreSQL store mounted by two `docfs mount` daemons, as two machines would mount it:
/// what one mount saves, creates, renames or deletes shows up in the other (through the other
/// daemon's cache invalidation; how fast is `scripts/bench.sh`'s B8), and two conflicting saves
/// keep both versions. Runs when the tests have a server
/// (DOCFS_TEST_POSTGRES_URL, set by scripts/test.sh).
@Suite("PostgresMount", .serialized, .enabled(if: StoreKind.postgresURL != nil))
struct PostgresMountTests {
    let sandbox: Sandbox
    let database: PostgresStore.Configuration
    let url: String

    init() throws {
        sandbox = try Sandbox()
        // A name no database has: `docfs create` makes the database itself.
        database = try StoreFixture.newDatabase()
        try PostgresStore.dropDatabase(database)
        url = database.url
    }

    func docfs(_ arguments: [String]) throws -> DocfsResult {
        try sandbox.run(arguments, prefix: DocfsMountTests.bounded)
    }

    func shell(_ script: String, _ arguments: String...) throws -> DocfsResult {
        try sandbox.execute(DocfsMountTests.bounded + ["/bin/sh", "-c", script, "sh"] + arguments)
    }

    func folder(_ name: String) throws -> String {
        let path = sandbox.path(name)
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Unmounts `mountpoint` if it is still mounted (the daemon then exits).
    func cleanUp(_ mountpoint: String) {
        if Mounts.entry(at: mountpoint) != nil {
            _ = try? sandbox.execute(
                DocfsMountTests.bounded + ["/usr/bin/fusermount3", "-u", "-z", mountpoint])
        }
    }

    /// The seconds until `condition` held (polled every 20 ms), or nil if it did not within `limit`.
    func seconds(until condition: () -> Bool, limit: Double = 10) -> Double? {
        let start = Date()
        while Date().timeIntervalSince(start) < limit {
            if condition() { return Date().timeIntervalSince(start) }
            usleep(20_000)
        }
        return nil
    }

    /// The daemons' log, for failure messages.
    func daemonLog() -> String { sandbox.daemonLog }

    func text(_ path: String) -> String? {
        try? String(contentsOfFile: path, encoding: .utf8)
    }

    @Test(
        "two daemons on one store: saves, creates, renames and deletes show up in the other, invalidated")
    func twoMounts() async throws {
        try await onOwnThread { [self] in
            defer { try? PostgresStore.dropDatabase(database) }
            let created = try docfs(["create", url, "--demo"])
            try #require(created.status == 0, "\(created)")
            let one = try folder("one")
            let two = try folder("two")
            defer {
                cleanUp(one)
                cleanUp(two)
            }
            for mountpoint in [one, two] {
                // The kernel may cache for a minute: only the daemon's invalidation can show
                // another mount's change within the waits below.
                let mounted = try docfs(["mount", url, mountpoint, "-o", "attr_timeout=60,entry_timeout=60"])
                try #require(mounted.status == 0, "\(mounted)\n\(daemonLog())")
                #expect(
                    Mounts.entry(at: mountpoint)?.source == url, "the source is the URL without a password")
            }
            #expect(text(two + "/README.txt") == text(one + "/README.txt"))

            // A save of an existing document.
            let saved = try shell("printf 'saved on one\\n' > \"$1/README.txt\"", one)
            #expect(saved.status == 0, "\(saved)")
            let save = seconds { text(two + "/README.txt") == "saved on one\n" }
            #expect(save != nil, "the save never showed up")

            // A new document, renamed, then deleted.
            _ = try shell("printf 'new\\n' > \"$1/new.txt\"", one)
            let create = seconds { text(two + "/new.txt") == "new\n" }
            #expect(
                create != nil,
                """
                the create never showed up: \(String(describing: text(two + "/new.txt"))), \
                listing \((try? FileManager.default.contentsOfDirectory(atPath: two).sorted()) ?? [])
                \(daemonLog())
                """)
            let moved = try shell("mv \"$1/new.txt\" \"$1/renamed.txt\"", one)
            #expect(moved.status == 0, "\(moved)")
            let rename = seconds {
                text(two + "/renamed.txt") == "new\n"
                    && !FileManager.default.fileExists(atPath: two + "/new.txt")
            }
            #expect(rename != nil, "the rename never showed up")
            _ = try shell("rm \"$1/renamed.txt\"", one)
            let delete = seconds { !FileManager.default.fileExists(atPath: two + "/renamed.txt") }
            #expect(delete != nil, "the delete never showed up")

            // And the other way round.
            _ = try shell("printf 'from two\\n' > \"$1/README.txt\"", two)
            let back = seconds { text(one + "/README.txt") == "from two\n" }
            #expect(back != nil, "the save never showed up")
            let figures = [save, create, rename, delete, back].map {
                $0.map { String(format: "%.3f", $0) } ?? "-"
            }
            print(
                "two mounts: save, create, rename, delete, save back seen after \(figures.joined(separator: ", ")) s"
            )

            // SIGUSR1 logs the store's statistics (as for SQLite), and the daemon serves on.
            let pid = try #require(sandbox.daemonPID(one))
            let statistics = sandbox.storeStatistics(of: pid)
            #expect(
                statistics.map { $0.bytesWritten > 0 && $0.bytesRead > 0 } == true,
                "\(String(describing: statistics))")
            #expect(kill(pid, 0) == 0 && text(one + "/README.txt") == "from two\n")
        }
    }

    @Test("two daemons save one document at once: both versions are kept, one as a conflict")
    func conflictingSaves() async throws {
        try await onOwnThread { [self] in
            defer { try? PostgresStore.dropDatabase(database) }
            let created = try docfs(["create", url, "--demo"])
            try #require(created.status == 0, "\(created)")
            let one = try folder("one")
            let two = try folder("two")
            defer {
                cleanUp(one)
                cleanUp(two)
            }
            // Saves only at close: with the default quiet interval (1 s), a loaded machine could
            // save the first write before the second mount's open, which would then rightly build
            // on it instead of conflicting.
            for mountpoint in [one, two] {
                let mounted = try docfs(["mount", url, mountpoint, "-o", "quiet_interval=120"])
                try #require(mounted.status == 0, "\(mounted)\n\(daemonLog())")
            }
            // Both open and write before either closes; then one closes (saving), then the other,
            // whose save is based on the version before the first one's. Each writer is a perl
            // that holds its descriptor: a shell's redirections duplicate and close descriptors,
            // and every close by a writer is a save point.
            let flags = try folder("flags")
            let program = try #require(Docfs.program).path
            let before = try #require(
                try PostgresStore(configuration: database).document(named: "README.txt")
            )
            .currentVersion.rawValue
            let hold = """
                open(my $f, ">", $ARGV[0]) or die "open: $!"; syswrite($f, "$ARGV[1]\\n") or die "write: $!";
                open(my $t, ">", $ARGV[2]) or die; close($t);
                select(undef, undef, undef, 0.05) until -e $ARGV[3];
                close($f) or die "close: $!"; open($t, ">", $ARGV[4]) or die; close($t);
                """
            let both = try shell(
                """
                perl -e "$4" "$1/README.txt" 'version one' "$3/one-written" "$3/one-go" "$3/one-closed" &
                perl -e "$4" "$2/README.txt" 'version two' "$3/two-written" "$3/two-go" "$3/two-closed" &
                until [ -e "$3/one-written" ] && [ -e "$3/two-written" ]; do sleep 0.05; done
                : > "$3/one-go"
                until [ -e "$3/one-closed" ]; do sleep 0.05; done
                # A close returns before its save commits (group commit): the second waits for
                # the first one's version, or on a loaded machine it could commit first.
                until "$5" ls "$6" | awk '$NF == "README.txt" { print $(NF-1) }' | grep -qvx "$7"; do
                  sleep 0.05
                done
                : > "$3/two-go"
                wait
                """, one, two, flags, hold, program, url, "\(before)")
            #expect(both.status == 0, "\(both)")
            let store = try PostgresStore(configuration: database)
            let info = try #require(try store.document(named: "README.txt"))
            func texts() throws -> [String] {
                try store.versions(of: info.id).map {
                    String(
                        decoding: try store.readContents(of: info.root, at: $0.id, offset: 0, count: 100),
                        as: UTF8.self)
                }
            }
            // Closes are committed by each daemon's group committer, moments after they return.
            _ = waitUntil(seconds: 5) { (try? texts().contains("version two\n")) == true }
            let versions = try store.versions(of: info.id)
            let texts = try texts()
            #expect(texts.contains("version one\n"), "\(texts)")
            #expect(texts.contains("version two\n"), "\(texts)")
            let listed = try docfs(["versions", url, "README.txt"])
            #expect(listed.status == 0, "\(listed)")
            let conflict = try #require(versions.first { $0.isConflict }, "\(versions)")
            #expect(listed.stdout.contains("conflict"), "\(listed)")
            // Both mounts show the store's current version, and the losing one beside it.
            let current = String(
                decoding: try store.readContents(of: info.root, at: nil, offset: 0, count: 100), as: UTF8.self
            )
            #expect(current == "version one\n")
            let lost = "version two\n"
            let entry = "README (conflict \(conflict.id.rawValue)).txt"
            #expect(
                seconds {
                    text(one + "/README.txt") == current && text(two + "/README.txt") == current
                        && text(one + "/" + entry) == lost && text(two + "/" + entry) == lost
                } != nil, "\(String(describing: try? FileManager.default.contentsOfDirectory(atPath: one)))")
            // Resolved on one machine (keeping the losing version), resolved on the other.
            let kept = try shell("mv \"$1/$2\" \"$1/README.txt\" && cat \"$1/README.txt\"", one, entry)
            #expect(kept.status == 0 && kept.stdout == lost, "\(kept)")
            #expect(
                seconds {
                    text(two + "/README.txt") == lost
                        && !FileManager.default.fileExists(atPath: two + "/" + entry)
                } != nil)
            #expect(try store.unresolvedConflicts().isEmpty)
        }
    }
}
