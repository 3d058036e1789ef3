import DocumentEngine
import Foundation
import TestSupport
import Testing

@testable import SQLiteStore

#if canImport(Glibc)
    import Glibc
#endif

/// `docfs mount` and `docfs unmount`, run as child processes: every child is bounded by
/// timeout(1), so a hung mount fails its test instead of stalling the suite, and every test
/// unmounts what it mounted (and stops any daemon left) on the way out.
@Suite("DocfsMount")
struct DocfsMountTests {
    let sandbox: Sandbox
    let store: String

    init() throws {
        sandbox = try Sandbox()
        store = sandbox.path("Demo.docstore")
        let created = try sandbox.run(["create", store, "--demo"])
        try #require(created.status == 0, "\(created)")
    }

    // MARK: Helpers

    /// timeout(1) in front of every child: TERM after 60 s, KILL 5 s later.
    static let bounded = ["/usr/bin/timeout", "--kill-after=5", "60"]

    func docfs(
        _ arguments: [String], prefix: [String] = [], environment: [String: String] = [:],
        directory: String? = nil
    ) throws -> DocfsResult {
        try sandbox.run(
            arguments, prefix: Self.bounded + prefix, environment: environment, directory: directory)
    }

    /// Runs another program (a path, then its arguments), bounded.
    func program(_ command: [String], directory: String? = nil) throws -> DocfsResult {
        try sandbox.execute(Self.bounded + command, directory: directory)
    }

    /// A new empty folder in the sandbox.
    func folder(_ name: String) throws -> String {
        let path = sandbox.path(name)
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    func pidFile(_ mountpoint: String) -> String { sandbox.pidFile(mountpoint) }
    func daemonPID(_ mountpoint: String) -> pid_t? { sandbox.daemonPID(mountpoint) }

    /// Unmounts `mountpoint` if it is still mounted and stops a daemon still serving it.
    func cleanUp(_ mountpoint: String) {
        if Mounts.entry(at: mountpoint) != nil {
            _ = try? program(["/usr/bin/fusermount3", "-u", "-z", mountpoint])
        }
        if let pid = daemonPID(mountpoint), isAlive(pid) {
            kill(pid, SIGTERM)
            if !waitUntil(seconds: 5, { !isAlive(pid) }) { kill(pid, SIGKILL) }
        }
    }

    /// Checks a failure's form (one `docfs:` line, nothing on standard output, non-zero exit)
    /// and that its message contains `expected`.
    func expectFailure(
        _ result: DocfsResult, _ expected: String, sourceLocation: SourceLocation = #_sourceLocation
    ) {
        #expect(result.status != 0, "\(result)", sourceLocation: sourceLocation)
        #expect(result.errorLines.count == 1, "one line: \(result)", sourceLocation: sourceLocation)
        #expect(result.stderr.hasPrefix("docfs: "), "\(result)", sourceLocation: sourceLocation)
        #expect(
            result.stderr.contains(expected), "expected \(expected): \(result)",
            sourceLocation: sourceLocation)
        #expect(result.stdout.isEmpty, "\(result)", sourceLocation: sourceLocation)
    }

    // MARK: Mounting and unmounting

    @Test("mount in the background: ls and cat read the store; unmount waits for the daemon to exit")
    func backgroundMount() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }

            let mounted = try docfs(["mount", store, mountpoint])
            #expect(mounted.status == 0 && mounted.stderr.isEmpty && mounted.stdout.isEmpty, "\(mounted)")
            // The launcher returns only once the mount is live.
            let entry = try #require(Mounts.entry(at: mountpoint), "mounted when mount returns")
            #expect(entry.type == "fuse.docfs")
            #expect(entry.source == store, "the source is the store")
            #expect(
                entry.options.contains("rw") && entry.options.contains("nosuid")
                    && entry.options.contains("nodev"))
            let pid = try #require(daemonPID(mountpoint), "the daemon's pid file")
            #expect(isAlive(pid))

            let names = try SQLiteStore(path: store).documents().map(\.name).sorted()
            let listed = try program(["/bin/ls", "-1", mountpoint])
            #expect(listed.status == 0, "\(listed)")
            #expect(listed.lines.sorted() == names)
            let readme = try program(["/bin/cat", mountpoint + "/README.txt"])
            let stored = try SQLiteStore(path: store)
            let info = try #require(try stored.document(named: "README.txt"))
            #expect(readme.status == 0, "\(readme)")
            #expect(readme.stdout == String(decoding: try stored.wholeContents(of: info.root), as: UTF8.self))
            #expect(!readme.stdout.isEmpty)

            let log = try String(
                contentsOfFile: sandbox.path("home/.local/state/docfs/docfs.log"), encoding: .utf8)
            #expect(
                log.contains("mounted") && log.contains("pid=\(pid)"),
                "the daemon logs to the log file: \(log)")
            // SIGUSR1 logs the store's statistics, and the daemon serves on.
            let statistics = sandbox.storeStatistics(of: pid)
            #expect(
                statistics.map { $0.bytesRead >= readme.stdout.utf8.count } == true,
                "\(String(describing: statistics))")
            #expect(isAlive(pid))

            // An fsync goes through the store's intent log; the unmount saves it and removes the log.
            // Close-on-exec: a program another suite spawns meanwhile would keep it open, and the
            // mount busy.
            let fd = open(mountpoint + "/README.txt", O_WRONLY | O_APPEND | O_CLOEXEC)
            try #require(fd >= 0)
            #expect(write(fd, "more\n", 5) == 5 && fsync(fd) == 0)
            close(fd)
            let logs = { (try? FileManager.default.contentsOfDirectory(atPath: store + "-intents")) ?? [] }
            #expect(logs().contains { $0.hasSuffix(".log") }, "the fsync was logged")

            let unmounted = try docfs(["unmount", mountpoint])
            #expect(unmounted.status == 0 && unmounted.stderr.isEmpty, "\(unmounted)")
            #expect(Mounts.entry(at: mountpoint) == nil, "the mount is gone")
            #expect(!isAlive(pid), "unmount returned after the daemon exited")
            #expect(!logs().contains { $0.hasSuffix(".log") }, "a clean unmount leaves no log: \(logs())")
            // The daemon emptied its write-ahead log into the store file, though this process
            // still has the store open: a copy of the file alone holds the last save.
            let copy = try folder("copy") + "/store.docfs"
            try FileManager.default.copyItem(atPath: store, toPath: copy)
            #expect(
                try SQLiteStore(path: copy).wholeContents(of: info.root).suffix(5) == Data("more\n".utf8))
            #expect(
                try SQLiteStore(path: store).wholeContents(of: info.root).suffix(5) == Data("more\n".utf8))
            #expect(
                !FileManager.default.fileExists(atPath: pidFile(mountpoint)),
                "the daemon removed its pid file")
        }
    }

    @Test(
        "a full disk at the unmount: the daemon keeps trying, unmount says so, and the file is saved once there is room; a daemon stopped then: unmount says what was lost",
        .enabled(if: getuid() == 0, "mounting a tmpfs needs root"))
    func fullDiskAtTheUnmount() async throws {
        try await onOwnThread { [self] in
            let disk = try folder("disk")
            guard mount("tmpfs", disk, "tmpfs", 0, "size=48m,mode=0700") == 0 else {
                Issue.record("cannot mount a tmpfs on \(disk): \(String(cString: strerror(errno)))")
                return
            }
            defer { if umount2(disk, 0) != 0 { umount2(disk, Int32(MNT_DETACH)) } }
            let full = disk + "/Full.docstore"
            try #require(try docfs(["create", full]).status == 0)
            let source = sandbox.path("source.bin")
            // 16 MiB of spill and 16 MiB of pack do not fit beside 20 MiB of something else.
            let filler = disk + "/filler"
            try Data(count: 20 << 20).write(to: URL(fileURLWithPath: filler))

            for giveUp in [false, true] {
                let mountpoint = try folder(giveUp ? "mnt2" : "mnt1")
                defer { cleanUp(mountpoint) }
                // The second daemon gives up after 3 s of trying.
                #expect(
                    try docfs(["mount", full, mountpoint] + (giveUp ? ["-o", "final_save_retry=3"] : []))
                        .status == 0)
                let pid = try #require(daemonPID(mountpoint))
                let name = giveUp ? "two.pkg" : "one.pkg"
                // Other bytes each round: the store would not store the same chunks again.
                let bytes = sampleBytes(16 << 20, seed: giveUp ? 78 : 77)
                try bytes.write(to: URL(fileURLWithPath: source))
                try FileManager.default.createDirectory(
                    atPath: mountpoint + "/" + name, withIntermediateDirectories: false)
                let copied = try program(["/bin/cp", source, mountpoint + "/" + name + "/big.bin"])
                #expect(copied.status == 0, "\(copied)")
                if giveUp {
                    // Waited for until the daemon gives up: unmount says what was lost.
                    let unmounted = try docfs(["unmount", "--timeout", "20", mountpoint])
                    #expect(unmounted.status != 0)
                    #expect(
                        unmounted.stderr.contains("could not save \(name): No space left on device")
                            && unmounted.stderr.contains("those changes are lost"), "\(unmounted)")
                    #expect(!isAlive(pid))
                    continue
                }
                let unmounted = try docfs(["unmount", "--timeout", "3", mountpoint])
                #expect(unmounted.status != 0)
                #expect(
                    unmounted.stderr.contains("cannot save \(name): No space left on device")
                        && unmounted.stderr.contains("kill \(pid)"), "\(unmounted)")
                #expect(isAlive(pid), "the daemon keeps trying")
                // Asked again, with nothing mounted there any more, unmount still waits for it.
                let again = try docfs(["unmount", "--timeout", "1", mountpoint])
                #expect(again.status != 0 && again.stderr.contains("cannot save \(name)"), "\(again)")
                try FileManager.default.removeItem(atPath: filler)
                #expect(waitUntil(seconds: 20, { !isAlive(pid) }), "the daemon saved and ended")
                let stored = try SQLiteStore(path: full)
                let document = try #require(try stored.document(named: name))
                let file = try #require(
                    try stored.nodes(of: document.id, at: nil).first { $0.name == "big.bin" })
                #expect(try stored.readContents(of: file.id, at: nil, offset: 0, count: bytes.count) == bytes)
                // The store holds 16 MiB more now: less filler fails the next round's save again.
                try Data(count: 8 << 20).write(to: URL(fileURLWithPath: filler))
            }
        }
    }

    @Test(
        "an fsync acknowledged just before kill -9 of the daemon is in the store for the next process that opens it"
    )
    func fsyncSurvivesKill() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let mounted = try docfs(["mount", store, mountpoint])
            try #require(mounted.status == 0, "\(mounted)")
            let pid = try #require(daemonPID(mountpoint))
            // Pages all over a 2 MiB file: the fsync logs them, and its save waits for the
            // committer (up to 20 ms), which the kill does not let run.
            var bytes = [UInt8](repeating: 0, count: 2 << 20)
            for index in bytes.indices {
                bytes[index] = UInt8(truncatingIfNeeded: index &* 2_654_435_761 >> 13)
            }
            let fd = open(mountpoint + "/README.txt", O_RDWR | O_TRUNC | O_CLOEXEC)
            try #require(fd >= 0)
            #expect(bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) } == bytes.count)
            #expect(fsync(fd) == 0)
            var page = [UInt8](repeating: 0xA5, count: 4096)
            for index in stride(from: 4096, to: bytes.count, by: 65_536) {
                page[0] = UInt8(truncatingIfNeeded: index >> 12)
                #expect(pwrite(fd, page, page.count, off_t(index)) == page.count)
                bytes.replaceSubrange(index..<index + 4096, with: page)
            }
            #expect(fsync(fd) == 0)
            #expect(kill(pid, SIGKILL) == 0)
            close(fd)
            _ = try program(["/usr/bin/fusermount3", "-u", "-z", mountpoint])
            #expect(waitUntil(seconds: 10, { !isAlive(pid) }))

            // The store alone, as `docfs export` or an app opens it: the log is saved and removed.
            let reopened = try SQLiteStore(path: store)
            let info = try #require(try reopened.document(named: "README.txt"))
            #expect(try reopened.wholeContents(of: info.root) == Data(bytes))
            #expect(try reopened.checkIntegrity().isClean)
            let logs = (try? FileManager.default.contentsOfDirectory(atPath: store + "-intents")) ?? []
            #expect(logs.filter { $0.hasSuffix(".log") }.isEmpty, "\(logs)")
        }
    }

    @Test(
        "a file last changed in a version `docfs gc` dropped reads, copies and takes an append in the next mount"
    )
    func fileOfADroppedVersion() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            try #require(try docfs(["mount", store, mountpoint]).status == 0)
            let package = mountpoint + "/kept.pkg"
            try #require(mkdir(package, 0o755) == 0)
            let kept = sampleBytes(300_000, seed: 60)
            try kept.write(to: URL(fileURLWithPath: package + "/kept.bin"))
            // Later versions change another file only.
            for seed in 61..<64 {
                try sampleBytes(50_000, seed: UInt64(seed)).write(
                    to: URL(fileURLWithPath: package + "/other.bin"))
            }
            try #require(try docfs(["unmount", mountpoint]).status == 0)
            let collected = try docfs(["gc", store, "--keep-last", "1", "--keep-for", "0"])
            #expect(
                collected.status == 0 && !collected.stdout.hasPrefix("removed 0 versions"), "\(collected)")

            try #require(try docfs(["mount", store, mountpoint]).status == 0)
            #expect(FileManager.default.contents(atPath: package + "/kept.bin") == kept, "read after the gc")
            let copied = try program(["/bin/cp", package + "/kept.bin", package + "/copy.bin"])
            #expect(copied.status == 0, "\(copied)")
            #expect(FileManager.default.contents(atPath: package + "/copy.bin") == kept)
            let fd = open(package + "/kept.bin", O_WRONLY | O_APPEND | O_CLOEXEC)
            try #require(fd >= 0)
            #expect(write(fd, "more", 4) == 4 && fsync(fd) == 0)
            close(fd)
            try #require(try docfs(["unmount", mountpoint]).status == 0)
            let reopened = try SQLiteStore(path: store)
            let info = try #require(try reopened.document(named: "kept.pkg"))
            let file = try #require(try reopened.nodes(of: info.id).first { $0.name == "kept.bin" })
            #expect(try reopened.wholeContents(of: file.id) == kept + Data("more".utf8))
            let report = try reopened.checkIntegrity()
            #expect(report.isClean, "\(report.problems)")
        }
    }

    @Test("the default store, -o ro and fsname=, a relative mount point, -o nonempty")
    func defaultStoreAndOptions() async throws {
        try await onOwnThread { [self] in
            let created = try sandbox.run(["create", "--demo"])
            try #require(created.status == 0, "\(created)")
            let mountpoint = try folder("default mount")
            defer { cleanUp(mountpoint) }

            let mounted = try docfs(["mount", "default mount", "-o", "ro", "-ofsname=my docs,debug"])
            #expect(mounted.status == 0, "\(mounted)")
            let entry = try #require(Mounts.entry(at: mountpoint))
            #expect(entry.source == "my docs")
            #expect(entry.options.contains("ro"), "\(entry)")
            #expect(try program(["/bin/ls", mountpoint]).stdout.contains("README.txt"))
            #expect(try docfs(["unmount", "default mount"]).status == 0)
            #expect(Mounts.entry(at: mountpoint) == nil)

            // Over a folder with contents only when asked.
            _ = FileManager.default.createFile(atPath: mountpoint + "/hidden.txt", contents: Data("x".utf8))
            expectFailure(try docfs(["mount", store, mountpoint]), "is not empty")
            let over = try docfs(["mount", store, mountpoint, "-o", "nonempty"])
            #expect(over.status == 0, "\(over)")
            #expect(try program(["/bin/ls", mountpoint]).stdout.contains("README.txt"))
            #expect(try docfs(["unmount", mountpoint]).status == 0)
            #expect(FileManager.default.fileExists(atPath: mountpoint + "/hidden.txt"), "shown again")
        }
    }

    @Test("mount -f serves in the foreground; SIGTERM unmounts it and it exits 0")
    func foregroundSIGTERM() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("fg")
            defer { cleanUp(mountpoint) }
            let program = try #require(Docfs.program)
            let child = try Child(
                Self.bounded + [program.path, "mount", "-f", store, mountpoint], sandbox: sandbox)
            defer { child.stop() }
            #expect(waitUntil(seconds: 30) { Mounts.entry(at: mountpoint) != nil }, "mounted")
            #expect(try self.program(["/bin/ls", mountpoint]).stdout.contains("README.txt"))
            // The pid file names the serving process: docfs itself, under timeout(1). It is
            // written once the mount is up, which on a loaded machine can be after `ls` answers.
            #expect(waitUntil(seconds: 30) { daemonPID(mountpoint) != nil }, "a pid file")
            let pid = try #require(daemonPID(mountpoint))
            #expect(kill(pid, SIGTERM) == 0)
            let status = try #require(child.wait(seconds: 30), "exits after SIGTERM")
            #expect(status == 0, "\(child.output)")
            #expect(Mounts.entry(at: mountpoint) == nil, "unmounted")
            #expect(child.output.contains("unmounted"), "its log on standard error: \(child.output)")
            #expect(!FileManager.default.fileExists(atPath: pidFile(mountpoint)))
        }
    }

    // MARK: Errors

    @Test("mount: a missing store, a file that is not a store, a damaged store")
    func storeErrors() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let missing = sandbox.path("Missing.docstore")
            expectFailure(try docfs(["mount", missing, mountpoint]), "no store at \(missing)")
            expectFailure(
                try docfs(["mount", mountpoint]),
                "no store at \(sandbox.defaultStore); create one with `docfs create`")
            let text = try sandbox.write(
                "notes.docstore", Data("just some text, long enough to be more than a header\n".utf8))
            expectFailure(
                try docfs(["mount", text, mountpoint]), "is not a DocFS store: it is not an SQLite database")
            let truncated = try sandbox.write(
                "truncated.docstore", Data("SQLite format 3\0".utf8) + Data(count: 40))
            expectFailure(try docfs(["mount", truncated, mountpoint]), "is damaged: the file is truncated")
            // Copied without its pack folder: the large files would fail to read once mounted.
            let large = sandbox.path("Large.docstore")
            let created = try docfs(["create", large])
            try #require(created.status == 0, "\(created)")
            let imported = try sandbox.write("big.bin", sampleBytes(2 << 20, seed: 1))
            let put = try docfs(["import", large, imported])
            try #require(put.status == 0, "\(put)")
            #expect(rename(large + "-packs", large + "-packs.away") == 0)
            expectFailure(
                try docfs(["mount", large, mountpoint]),
                "is damaged: its pack folder \(large)-packs is missing, though")
            #expect(Mounts.entry(at: mountpoint) == nil)
        }
    }

    @Test("mount: the mount point missing, not a folder, not empty, already a mount point")
    func mountpointErrors() async throws {
        try await onOwnThread { [self] in
            let missing = sandbox.path("nowhere")
            expectFailure(try docfs(["mount", store, missing]), "the mount point \(missing) does not exist")
            let file = try sandbox.write("file", Data("x".utf8))
            expectFailure(try docfs(["mount", store, file]), "the mount point \(file) is not a directory")
            let full = try folder("full")
            try sandbox.write("full/something", Data())
            expectFailure(try docfs(["mount", store, full]), "the mount point \(full) is not empty")

            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            try #require(try docfs(["mount", store, mountpoint]).status == 0)
            expectFailure(try docfs(["mount", store, mountpoint]), "the mount point \(mountpoint) is busy")
            #expect(try docfs(["unmount", mountpoint]).status == 0)
        }
    }

    @Test("mount: no FUSE device")
    func noDevice() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let device = sandbox.path("no-fuse")
            expectFailure(
                try docfs(["mount", store, mountpoint], environment: ["DOCFS_FUSE_DEVICE": device]),
                "\(device) is missing")
            expectFailure(
                try docfs(["mount", store, mountpoint], environment: ["DOCFS_FUSE_DEVICE": store]),
                "is not the FUSE device")
        }
    }

    @Test("mount: an option neither docfs nor libfuse knows; subtype=; one libfuse ends the session over")
    func unknownOption() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            expectFailure(
                try docfs(["mount", store, mountpoint, "-o", "ro,no_such_option=1,noexec"]),
                "unknown mount option no_such_option=1 (neither docfs nor libfuse knows it)")
            expectFailure(
                try docfs(["mount", store, mountpoint, "-f", "-o", "bogus"]), "unknown mount option bogus")
            expectFailure(try docfs(["mount", store, mountpoint, "-o", "subtype=x"]), "fuse.docfs")
            expectFailure(
                try docfs(["mount", store, mountpoint, "-o", "archives=json"]), "-o archives= is xml")
            expectFailure(
                try docfs(["mount", store, mountpoint, "-o", "housekeeping"]), "-o housekeeping= is scratch")
            for bad in ["quiet_interval=soon", "quiet_interval=0", "quiet_interval"] {
                expectFailure(
                    try docfs(["mount", store, mountpoint, "-o", bad]),
                    "-o quiet_interval= needs a number of seconds above 0 and at most 86400")
            }
            for bad in ["final_save_retry=-1", "final_save_retry=later", "final_save_retry"] {
                expectFailure(
                    try docfs(["mount", store, mountpoint, "-o", bad]),
                    "-o final_save_retry= needs a number of seconds from 0 to 86400")
            }
            for bad in ["attr_timeout=-1", "attr_timeout=soon", "entry_timeout", "entry_timeout=1e9"] {
                let name = bad.prefix { $0 != "=" }
                expectFailure(
                    try docfs(["mount", store, mountpoint, "-o", bad]),
                    "-o \(name)= needs a number of seconds from 0 to 86400")
            }
            // libfuse knows max_read= but ends the session at the kernel's INIT unless the file
            // system asks for the same size: the daemon finds out after mounting, and the
            // launcher quotes libfuse's reason from the log.
            expectFailure(
                try docfs(["mount", store, mountpoint, "-o", "max_read=131072"]),
                "the mount at \(mountpoint) did not come up: ")
            expectFailure(
                try docfs(["mount", store, mountpoint, "-o", "max_read=131072"]), "maximum read size")
            #expect(Mounts.entry(at: mountpoint) == nil)
        }
    }

    @Test("-o archives=xml: the demo's keyed archive reads as XML text through the daemon")
    func archivesAsXML() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let mounted = try docfs(["mount", store, mountpoint, "-o", "archives=xml,housekeeping=keep"])
            try #require(mounted.status == 0, "\(mounted)")
            let path = mountpoint + "/Things I Own.mystuff/things.data"
            let text = try String(contentsOfFile: path, encoding: .utf8)
            #expect(text.hasPrefix("<?xml") && text.contains("<string>NSKeyedArchiver</string>"))
            var st = stat()
            #expect(stat(path, &st) == 0 && Int(st.st_size) == text.utf8.count)
        }
    }

    /// With the kernel's writeback cache (the default) an open file's bytes reach the daemon
    /// only when the kernel writes them back, so these run without it: each write(2) is then
    /// the daemon's at once, and the quiet interval alone decides.
    @Test(
        "-o quiet_interval= sets how long an open file's change waits before it is saved; -o no_writeback_cache",
        arguments: [
            ("quiet_interval=60,no_writeback_cache", false), ("quiet_interval=0.5,no_writeback_cache", true),
        ])
    func quietInterval(_ options: String, savedWhileOpen: Bool) async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let mounted = try docfs(["mount", store, mountpoint, "-o", options])
            try #require(mounted.status == 0, "\(mounted)")
            let docfsPath = try #require(Docfs.program).path
            let count = "\"$2\" versions \"$3\" README.txt | wc -l"
            // Kept open with a change for 2.5 s: 0.5 s saves it meanwhile, 60 s does not and the
            // close saves it. (perl, because a shell's redirections duplicate and close
            // the descriptor, and every close by the writer is a save point.)
            let held = try program([
                "/bin/sh", "-c",
                """
                \(count)
                perl -e '
                    sub count { my @lines = `"$ARGV[1]" versions "$ARGV[2]" README.txt`; print scalar(@lines), "\\n" }
                    open(my $f, ">", $ARGV[0]) or die "open: $!"; syswrite($f, "held open\\n") or die "write: $!";
                    select(undef, undef, undef, 2.5); count(); close($f) or die "close: $!"; count()' \\
                    "$1/README.txt" "$2" "$3"
                """,
                "sh", mountpoint, docfsPath, store,
            ])
            #expect(held.status == 0, "\(held)")
            let counts = held.stdout.split(separator: "\n").compactMap {
                Int($0.trimmingCharacters(in: .whitespaces))
            }
            try #require(counts.count == 3, "\(held)")
            if savedWhileOpen {
                #expect(counts[1] == counts[0] + 1, "not saved while open: \(held)")
                #expect(counts[2] == counts[1], "saved again at close: \(held)")
            } else {
                #expect(counts[1] == counts[0], "saved while open: \(held)")
                #expect(counts[2] == counts[0] + 1, "not saved at close: \(held)")
            }
        }
    }

    @Test("the daemon reports a failure on its ready descriptor, in one line")
    func daemonReportsFailure() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            let report = sandbox.path("report")
            let program = try #require(Docfs.program)
            let missing = sandbox.path("Missing.docstore")
            // What the launcher sees when the daemon it started cannot mount.
            let result = try self.program([
                "/bin/sh", "-c", "\"$0\" mount --foreground --ready-fd 3 \"$1\" \"$2\" 3>\"$3\" 2>/dev/null",
                program.path, missing, mountpoint, report,
            ])
            #expect(result.status == 1, "\(result)")
            #expect(
                try String(contentsOfFile: report, encoding: .utf8)
                    == "error: no store at \(missing); create one with `docfs create \(missing)`\n")
        }
    }

    @Test("mount: no permission to the store or the mount point (as nobody)")
    func permissions() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            guard getuid() == 0 else {
                // Without root, take the rights away instead.
                #expect(chmod(store, 0) == 0)
                expectFailure(try docfs(["mount", store, mountpoint]), "permission denied")
                #expect(chmod(store, 0o600) == 0 && chmod(mountpoint, 0o555) == 0)
                expectFailure(
                    try docfs(["mount", store, mountpoint]), "no permission to mount on \(mountpoint)")
                return
            }
            let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
            #expect(chmod(sandbox.path, 0o755) == 0)
            // The store is root's (0600).
            expectFailure(try docfs(["mount", store, mountpoint], prefix: nobody), "permission denied")
            // nobody's own store, but root's mount point (0755).
            let own = try folder("nobody")
            let ownStore = own + "/Demo.docstore"
            try FileManager.default.copyItem(atPath: store, toPath: ownStore)
            #expect(chown(own, 65534, 65534) == 0 && chown(ownStore, 65534, 65534) == 0)
            expectFailure(
                try docfs(["mount", ownStore, mountpoint], prefix: nobody),
                "no permission to mount on \(mountpoint)")
            #expect(Mounts.entry(at: mountpoint) == nil)
        }
    }

    @Test(
        "a daemon that dies before mounting: the launcher quotes libfuse's reason from the log",
        .enabled(if: getuid() == 0 && !fuseDeviceOpenToAll(), "needs root and a /dev/fuse others cannot open")
    )
    func daemonDiesBeforeMounting() async throws {
        try await onOwnThread { [self] in
            // As nobody, with the check pointed at a device anyone may open, libfuse itself
            // then fails to open /dev/fuse in the daemon.
            let own = try folder("nobody")
            let mountpoint = try folder("nobody/mnt")
            let ownStore = own + "/Demo.docstore"
            try FileManager.default.copyItem(atPath: store, toPath: ownStore)
            let home = try folder("home")  // the daemon's log goes in there
            for path in [own, mountpoint, ownStore, home] { #expect(chown(path, 65534, 65534) == 0) }
            #expect(chmod(sandbox.path, 0o755) == 0)
            defer { cleanUp(mountpoint) }
            let nobody = ["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
            expectFailure(
                try docfs(
                    ["mount", ownStore, mountpoint], prefix: nobody,
                    environment: ["DOCFS_FUSE_DEVICE": "/dev/null"]),
                "(fuse: failed to open /dev/fuse: Permission denied)")
            #expect(Mounts.entry(at: mountpoint) == nil)
        }
    }

    @Test("unmount --abort frees a process stuck on a daemon that does not answer, and detaches the mount")
    func unmountAbort() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            let pid = try #require(
                try docfs(["mount", store, mountpoint]).status == 0 ? daemonPID(mountpoint) : nil)
            // A daemon that answers nothing: stopped, so a lookup waits for it for ever.
            try #require(kill(pid, SIGSTOP) == 0)
            defer {
                kill(pid, SIGCONT)
                cleanUp(mountpoint)
            }
            let stuck = try Child(
                Self.bounded + ["/bin/cat", mountpoint + "/a name never looked up"], sandbox: sandbox)
            defer { stuck.stop() }
            #expect(stuck.wait(seconds: 1) == nil, "cat did not wait for the stopped daemon")
            let aborted = try docfs(["unmount", "--abort", mountpoint])
            #expect(aborted.status == 0 && aborted.stderr.isEmpty, "\(aborted)")
            #expect(Mounts.entry(at: mountpoint) == nil, "still mounted")
            let status = stuck.wait(seconds: 10)
            #expect(status != nil && status != 0 && status != 124, "cat: \(String(describing: status))")
            // Let go, the daemon finds its connection gone and ends.
            kill(pid, SIGCONT)
            #expect(waitUntil(seconds: 20) { !isAlive(pid) }, "the daemon did not end")
        }
    }

    @Test("unmount: not a docfs mount; busy while a process works in it; --lazy detaches")
    func unmountErrors() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            expectFailure(
                try docfs(["unmount", mountpoint]),
                "\(mountpoint) is not a docfs mount: nothing is mounted there")
            expectFailure(try docfs(["unmount", "/proc"]), "/proc is not a docfs mount: it is proc")

            try #require(try docfs(["mount", store, mountpoint]).status == 0)
            let pid = try #require(daemonPID(mountpoint))
            // A process whose working directory is in the mount keeps it busy.
            let sleeper = try Child(
                Self.bounded + ["/bin/sleep", "30"], sandbox: sandbox, directory: mountpoint)
            defer { sleeper.stop() }
            expectFailure(try docfs(["unmount", mountpoint]), "cannot unmount \(mountpoint): it is busy")
            #expect(Mounts.entry(at: mountpoint) != nil && isAlive(pid))

            let lazy = try docfs(["unmount", "--lazy", mountpoint])
            #expect(lazy.status == 0 && lazy.stderr.isEmpty, "\(lazy)")
            #expect(Mounts.entry(at: mountpoint) == nil, "detached at once")
            sleeper.stop()
            #expect(
                waitUntil(seconds: 20) { !isAlive(pid) }, "the daemon ends once the mount is no longer used")
        }
    }

    // MARK: mount(8)

    @Test(
        "mount -t fuse.docfs and an fstab line run docfs through mount.fuse3",
        .enabled(
            if: getuid() == 0 && FileManager.default.fileExists(atPath: "/usr/local/sbin")
                && FileManager.default.isExecutableFile(atPath: "/usr/bin/unshare")
                && FileManager.default.isExecutableFile(atPath: "/sbin/mount.fuse3"),
            "needs root, /usr/local/sbin, unshare and mount.fuse3"))
    func mountHelper() async throws {
        try await onOwnThread { [self] in
            let mountpoint = try folder("mnt")
            defer { cleanUp(mountpoint) }
            let program = try #require(Docfs.program)
            // mount(8) runs mount.fuse3 without the caller's PATH, and mount.fuse3 finds `docfs`
            // through /bin/sh's default one. In a mount namespace of its own, a folder holding a
            // docfs link is bound over /usr/local/sbin (first on that PATH), so nothing outside
            // the test changes; the FUSE mounts live and die in that namespace too.
            let bin = try folder("bin")
            try FileManager.default.createSymbolicLink(
                atPath: bin + "/docfs", withDestinationPath: program.path)
            let fstab = try sandbox.write(
                "fstab", Data("\(store) \(mountpoint) fuse.docfs defaults,noauto 0 0\n".utf8))
            let script = """
                set -eu
                mount --bind "$BIN" /usr/local/sbin
                mount -t fuse.docfs "$STORE" "$MNT" -o ro
                grep -F " $MNT fuse.docfs " /proc/self/mounts
                ls "$MNT"
                "$DOCFS" unmount "$MNT"
                echo "unmounted 1: $(grep -c -F " $MNT " /proc/self/mounts || true)"
                mount -T "$FSTAB" "$MNT"
                grep -F " $MNT fuse.docfs " /proc/self/mounts
                cat "$MNT/README.txt"
                "$DOCFS" unmount "$MNT"
                echo "unmounted 2: $(grep -c -F " $MNT " /proc/self/mounts || true)"
                """
            let result = try sandbox.execute(
                Self.bounded + [
                    "/usr/bin/unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", script,
                ],
                environment: [
                    "BIN": bin, "STORE": store, "MNT": mountpoint, "FSTAB": fstab, "DOCFS": program.path,
                    // mount(8) clears HOME for its helpers (docfs would then log in root's home);
                    // XDG_STATE_HOME passes.
                    "XDG_STATE_HOME": sandbox.path("home/.local/state"),
                ])
            #expect(result.status == 0, "\(result)")
            let lines = result.lines
            // -o ro reached the mount; mount.fuse3's dev,suid did not.
            #expect(
                lines.first?.hasPrefix("\(store) \(mountpoint) fuse.docfs ro,nosuid,nodev,") == true,
                "\(result)")
            #expect(lines.contains("Things I Own.mystuff"), "\(result)")
            #expect(lines.contains("unmounted 1: 0"), "\(result)")
            #expect(
                lines.contains { $0.hasPrefix("\(store) \(mountpoint) fuse.docfs rw,") },
                "the fstab mount: \(result)")
            #expect(lines.contains("unmounted 2: 0"), "\(result)")
            #expect(result.stderr.isEmpty, "\(result)")
            let log = try String(
                contentsOfFile: sandbox.path("home/.local/state/docfs/docfs.log"), encoding: .utf8)
            #expect(
                log.components(separatedBy: "[docfs] unmounted").count == 3,
                "both daemons logged here: \(log)")
        }
    }
}

// MARK: - Support

/// Runs `body` on a thread of its own (blocking waits stay off the cooperative pool) with
/// SIGTERM, SIGINT, SIGHUP and SIGALRM unblocked. The test runner's threads block nearly every
/// signal and posix_spawn children inherit the spawning thread's mask, so without this a child's
/// SIGTERM (timeout(1) passing one on, `Process.terminate()`) would never arrive.
///
/// `body` (and the test's sandbox it holds) is released before the test resumes: a thread's
/// closure otherwise lives until the thread exits, which for the last test can be after the
/// process has, and the sandbox would never be removed.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    let box = BodyBox(body)
    return try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread {
            var signals = sigset_t()
            sigemptyset(&signals)
            for signal in [SIGTERM, SIGINT, SIGHUP, SIGALRM] { sigaddset(&signals, signal) }
            pthread_sigmask(SIG_UNBLOCK, &signals, nil)
            let result = box.run()
            continuation.resume(with: result)
        }
    }
}

/// Holds a body until it has run once, then lets it go.
private final class BodyBox<T: Sendable>: @unchecked Sendable {
    private var body: (@Sendable () throws -> T)?
    private let lock = NSLock()

    init(_ body: @escaping @Sendable () throws -> T) { self.body = body }

    func run() -> Result<T, any Error> {
        let taken = lock.withLock {
            defer { body = nil }
            return body
        }
        guard let taken else { return .failure(CancellationError()) }
        return Result { try taken() }
    }
}

/// The kernel's mount table, as this process sees it.
enum Mounts {
    struct Entry: Equatable, CustomStringConvertible {
        var mountPoint: String
        var type: String
        var source: String
        var options: [String]
        var description: String {
            "\(source) on \(mountPoint) type \(type) (\(options.joined(separator: ",")))"
        }
    }

    static func entry(at path: String) -> Entry? {
        guard let text = readSystemFile("/proc/self/mountinfo") else { return nil }
        return text.split(separator: "\n").compactMap { line -> Entry? in
            let fields = line.split(separator: " ").map { unescape(String($0)) }
            guard let dash = fields.firstIndex(of: "-"), dash + 2 < fields.count, fields.count > 5 else {
                return nil
            }
            return Entry(
                mountPoint: fields[4], type: fields[dash + 1], source: fields[dash + 2],
                options: fields[5].split(separator: ",").map(String.init))
        }.last { $0.mountPoint == path }
    }

    private static func unescape(_ field: String) -> String {
        field.replacingOccurrences(of: "\\040", with: " ").replacingOccurrences(of: "\\011", with: "\t")
            .replacingOccurrences(of: "\\012", with: "\n").replacingOccurrences(of: "\\134", with: "\\")
    }
}

/// Whether every user may open /dev/fuse (its usual mode, 0666).
func fuseDeviceOpenToAll() -> Bool {
    var st = stat()
    return stat("/dev/fuse", &st) == 0 && st.st_mode & 0o006 == 0o006
}

/// Whether `pid` is a live process (not gone, not a zombie waiting for its parent).
func isAlive(_ pid: pid_t) -> Bool {
    guard let stat = readSystemFile("/proc/\(pid)/stat"),
        let close = stat.lastIndex(of: ")")
    else { return false }
    let state = stat[stat.index(after: close)...].split(separator: " ").first
    return state != "Z" && state != "X"
}

/// Polls `condition` every 20 ms for at most `seconds`; returns whether it became true.
func waitUntil(seconds: Double, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if condition() { return true }
        usleep(20_000)
    }
    return condition()
}

/// A child process that runs while the test goes on, its output in a file.
final class Child {
    let process: Process
    let outputPath: String

    init(_ command: [String], sandbox: Sandbox, directory: String? = nil) throws {
        process = Process()
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        process.environment = sandbox.environment
        process.currentDirectoryURL = URL(fileURLWithPath: directory ?? sandbox.path)
        outputPath = sandbox.path("child-\(UUID().uuidString)")
        _ = FileManager.default.createFile(atPath: outputPath, contents: nil)
        let output = try FileHandle(forWritingTo: URL(fileURLWithPath: outputPath))
        process.standardOutput = output
        process.standardError = output
        process.standardInput = FileHandle.nullDevice
        try process.run()
        try output.close()
    }

    /// Its exit status, or nil if it is still running after `seconds`.
    func wait(seconds: Double) -> Int32? {
        guard waitUntil(seconds: seconds, { !process.isRunning }) else { return nil }
        return process.terminationStatus
    }

    /// Standard output and error so far.
    var output: String { (try? String(contentsOfFile: outputPath, encoding: .utf8)) ?? "" }

    /// Ends it (SIGTERM to timeout(1), which passes it on) and waits; if that is not enough,
    /// kills timeout(1)'s process group (it leads one), its child included.
    func stop() {
        guard process.isRunning else { return }
        process.terminate()
        if wait(seconds: 10) == nil { kill(-process.processIdentifier, SIGKILL) }
    }
}
