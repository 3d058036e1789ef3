import DocumentEngine
import DocumentFS
import FUSE
import Foundation
import SampleDocuments
import StoreTestSupport
import SystemPackage
import TestSupport
import Testing
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

struct TestFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// Lines of /proc/self/mounts whose mountpoint is `path`.
func mountLines(_ path: String) -> [String] {
    guard let mounts = readSystemFile("/proc/self/mounts") else { return [] }
    return mounts.split(separator: "\n").map(String.init).filter {
        $0.split(separator: " ").dropFirst().first.map(String.init) == path
    }
}

func isMounted(_ path: String) -> Bool { !mountLines(path).isEmpty }

/// A fresh directory from mkdtemp.
func temporaryDirectory(_ prefix: String) throws -> String {
    var template = Array("/tmp/\(prefix).XXXXXX".utf8CString)
    guard let dir = mkdtemp(&template) else { throw Errno(rawValue: errno) }
    return String(cString: dir)
}

/// How long a test may hold a mount before the watchdog aborts it: 180 s (a busy cooperative pool can delay a test by tens of seconds), or
/// `DOCFS_TEST_MOUNT_DEADLINE` seconds.
let defaultMountDeadline: Duration = {
    if let text = ProcessInfo.processInfo.environment["DOCFS_TEST_MOUNT_DEADLINE"],
        let seconds = Double(text),
        seconds > 0
    {
        return .milliseconds(Int64(seconds * 1000))
    }
    return .seconds(180)
}()

/// Guards one FUSE mount against a hung test: if the test has not closed the mount by the deadline,
/// the watchdog aborts the FUSE connection (`/sys/fs/fuse/connections/<n>/abort`), so every
/// syscall blocked on it returns ENOTCONN/ECONNABORTED and the test fails instead of hanging the
/// whole suite (the last CI run died on a 25-minute hang). The failure is recorded when the test
/// closes the mount (``TestMount/close(expectingWatchdog:)``), where the test's context is known.
final class MountWatchdog: @unchecked Sendable {
    let path: String
    let deadline: Duration
    /// The fusectl connection number (the minor number of the mount's st_dev), read from
    /// /proc/self/mountinfo so that no syscall on the mount itself is needed.
    let connection: UInt32?
    private let condition = NSCondition()
    private var cancelled = false
    private var firedMessage: String?

    init(path: String, deadline: Duration) {
        self.path = path
        self.deadline = deadline
        connection = fuseConnection(of: path)
        let seconds = Double(deadline.components.seconds) + Double(deadline.components.attoseconds) / 1e18
        let until = Date().addingTimeInterval(seconds)
        Thread.detachNewThread { [self] in
            condition.lock()
            while !cancelled {
                if !condition.wait(until: until) { break }
            }
            let expired = !cancelled
            condition.unlock()
            guard expired else { return }
            let message =
                "watchdog: the mount \(path) was still open after \(deadline); aborted the FUSE connection"
            condition.lock()
            firedMessage = message
            condition.unlock()
            let outcome = abortConnection()
            FileHandle.standardError.write(Data((message + " (\(outcome))\n").utf8))
            condition.lock()
            firedMessage = message + " (\(outcome))"
            condition.unlock()
        }
    }

    /// What the watchdog did, or nil while it has not fired.
    var fired: String? {
        condition.lock()
        defer { condition.unlock() }
        return firedMessage
    }

    /// Stops watching; returns what the watchdog did if it fired before.
    @discardableResult
    func cancel() -> String? {
        condition.lock()
        defer { condition.unlock() }
        cancelled = true
        condition.broadcast()
        return firedMessage
    }

    /// Writes to the connection's `abort` file (mounting fusectl when /sys/fs/fuse/connections is
    /// empty); without one, a forced unmount, which aborts a FUSE connection too.
    private func abortConnection() -> String {
        let connections = "/sys/fs/fuse/connections"
        if let connection {
            let entries = (try? FileManager.default.contentsOfDirectory(atPath: connections)) ?? []
            if entries.isEmpty {
                _ = Glibc.mount("fusectl", connections, "fusectl", 0, nil)
            }
            let abortFile = "\(connections)/\(connection)/abort"
            let fd = open(abortFile, O_WRONLY | O_CLOEXEC)
            if fd >= 0 {
                let written = write(fd, "1", 1)
                close(fd)
                if written == 1 { return "wrote 1 to \(abortFile)" }
            }
        }
        if umount2(path, Int32(MNT_FORCE)) == 0 { return "forced unmount" }
        return "could not abort: \(String(cString: strerror(errno)))"
    }
}

/// The minor device number of the FUSE mount at `path` (its fusectl connection directory), from
/// /proc/self/mountinfo.
func fuseConnection(of path: String) -> UInt32? {
    guard let info = readSystemFile("/proc/self/mountinfo") else { return nil }
    for line in info.split(separator: "\n") {
        let fields = line.split(separator: " ")
        guard fields.count > 4, fields[4] == path else { continue }
        let device = fields[2].split(separator: ":")
        guard device.count == 2 else { continue }
        return UInt32(device[1])
    }
    return nil
}

/// A store mounted at a fresh directory, served on background threads, under a
/// ``MountWatchdog``.
final class TestMount: Sendable {
    let path: String
    let mount: DocumentFSMount
    let watchdog: MountWatchdog

    init(
        _ store: any FileSystemStore, deadline: Duration = defaultMountDeadline,
        configure: (inout DocumentFSMount.Options) -> Void = { _ in }
    ) throws {
        path = try temporaryDirectory("docfs-mnt")
        var options = DocumentFSMount.Options()
        options.drainTimeout = .seconds(2)
        options.debug = ProcessInfo.processInfo.environment["FUSE_TEST_DEBUG"] != nil
        configure(&options)
        do {
            mount = try DocumentFSMount(store: store, at: path, options: options)
            try mount.start()
        } catch {
            rmdir(path)
            throw error
        }
        // Until the mount is listed, paths would reach the directory underneath.
        let deadline5 = Date().addingTimeInterval(5)
        while !isMounted(path) {
            guard Date() < deadline5 else {
                mount.unmount()
                rmdir(path)
                throw TestFailure("\(path) never appeared in /proc/self/mounts")
            }
            usleep(1000)
        }
        // Watched from here on: even the first request below cannot hang the suite.
        watchdog = MountWatchdog(path: path, deadline: deadline)
        var st = stat()
        _ = lstat(path, &st)
    }

    func url(_ name: String) -> String { path + "/" + name }

    /// Unmounts (idempotent) and removes the directory. Records a test failure if the watchdog
    /// had to abort the mount (or, with `expectingWatchdog`, if it did not).
    func close(expectingWatchdog: Bool = false) {
        let fired = watchdog.cancel()
        mount.unmount()
        if isMounted(path) {
            // Last resort so a failing test never leaves a mount behind.
            _ = try? runTimed("/bin/fusermount3", ["-u", "-z", path], seconds: 20)
        }
        rmdir(path)
        if let fired, !expectingWatchdog {
            Issue.record(Comment(rawValue: fired))
        } else if fired == nil, expectingWatchdog {
            Issue.record("the watchdog of \(path) never fired")
        }
    }
}

/// Mounts `store`, runs `body`, and always unmounts.
func withMount<T>(
    _ store: any FileSystemStore, deadline: Duration = defaultMountDeadline,
    configure: (inout DocumentFSMount.Options) -> Void = { _ in },
    isolation: isolated (any Actor)? = #isolation,
    _ body: (TestMount) async throws -> T
) async throws -> T {
    let mount = try TestMount(store, deadline: deadline, configure: configure)
    do {
        let result = try await body(mount)
        mount.close()
        return result
    } catch {
        mount.close()
        throw error
    }
}

/// The limit every child process of these tests runs under (`timeout -k 5 <seconds>`).
let childTimeout = 60

/// The arguments that run `executable` under `timeout -k 5 <seconds>`, started through `sh`:
/// children of this process inherit a signal mask with nearly every signal blocked (the threads
/// that spawn them block signals), so `timeout`'s SIGTERM would go unnoticed until the SIGKILL;
/// dash clears the mask in the children it forks (not on `exec`, hence no `exec`).
func timedCommand(_ executable: String, _ arguments: [String], seconds: Int) -> [String] {
    ["-c", "/usr/bin/timeout -k 5 \(seconds) \"$@\"", "sh", executable] + arguments
}

/// Runs a program under `timeout -k 5 <seconds>` (so a child blocked on a broken mount, or an
/// editor waiting for input, cannot hang the suite). Call it off the cooperative pool.
func runTimed(
    _ executable: String, _ arguments: [String], directory: String? = nil, seconds: Int = childTimeout
) throws -> ProcessResult {
    try run("/bin/sh", timedCommand(executable, arguments, seconds: seconds), directory: directory)
}

/// Runs a shell script in `directory` on its own thread; C locale so outputs are stable.
func sh(_ script: String, in directory: String, seconds: Int = childTimeout) async throws -> ProcessResult {
    try await offThread {
        try runTimed(
            "/bin/sh", ["-c", "LC_ALL=C; export LC_ALL; " + script], directory: directory, seconds: seconds)
    }
}

/// Runs a shell script and returns its raw standard output bytes.
func shBytes(_ script: String, in directory: String) async throws -> Data {
    try await offThread {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = timedCommand("/bin/sh", ["-c", script], seconds: childTimeout)
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return data
    }
}

func lstatOf(_ path: String) throws -> stat {
    var st = stat()
    guard lstat(path, &st) == 0 else { throw Errno(rawValue: errno) }
    return st
}

/// Mount options under which the kernel keeps entries and attributes for a minute: a change by
/// another process can then show up within a test's wait only through the daemon's cache
/// invalidation, which is what a test that uses them checks. How fast it shows is a figure of
/// `scripts/bench.sh` (B8), never a test's assertion.
func kernelCachesForAMinute(_ options: inout DocumentFSMount.Options) {
    options.fileSystem.attributeTimeout = .seconds(60)
    options.fileSystem.entryTimeout = .seconds(60)
}

/// Polls `condition` every 20 ms for up to `timeout` seconds; returns the seconds it took, or
/// nil if it never held.
func eventually(timeout: Double, _ condition: () throws -> Bool) -> Double? {
    let start = Date()
    while Date().timeIntervalSince(start) < timeout {
        if (try? condition()) == true { return Date().timeIntervalSince(start) }
        usleep(20_000)
    }
    return (try? condition()) == true ? Date().timeIntervalSince(start) : nil
}

/// A store in a fresh directory: the demo documents plus `Project.pkg`, a package with nested
/// folders, a symbolic link, extended attributes, an executable and a big file.
struct Fixture: Sendable {
    static let chunkSize = 256 * 1024
    /// 8 chunks plus a partial one.
    static let bigSize = 8 * chunkSize + 1000
    static let modified = Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_789)

    /// The store: a file in a fresh directory (SQLite) or a database of its own (PostgreSQL),
    /// removed when the last copy of the fixture goes.
    let stores: StoreFixture
    var store: any VersionedDocumentStore { stores.store }
    /// The SQLite store file's path, or the PostgreSQL database's URL.
    var path: String { stores.location }
    var kind: StoreKind { stores.kind }

    /// Deterministic bytes, different in every 4 KiB block.
    static func bigContents() -> Data {
        var bytes = [UInt8](repeating: 0, count: bigSize)
        var x: UInt32 = 2_463_534_242
        for i in 0..<bigSize {
            x ^= x << 13
            x ^= x >> 17
            x ^= x << 5
            bytes[i] = UInt8(truncatingIfNeeded: x)
        }
        return Data(bytes)
    }

    @MainActor
    static func make(_ kind: StoreKind = .sqlite) async throws -> Fixture {
        let stores = try StoreFixture(kind, chunkSize: chunkSize, name: "S")
        try await DemoDocuments.populate(stores.store)
        try addProject(stores.store)
        return Fixture(stores: stores)
    }

    /// Another store object on the same store, as another process would open it.
    func reopen() throws -> any VersionedDocumentStore { try stores.reopen() }

    static func addProject(_ store: some DocumentStore) throws {
        let info = try store.createDocument(
            named: "Project.pkg", kind: .package, type: nil, permissions: 0o755, origin: "test")
        let ids = try store.makeNodeIDs(count: 8)
        let (notes, src, main, deep, deeper, leaf, link, big) = (
            ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[7]
        )
        func record(
            _ id: StoreNodeID, _ parent: StoreNodeID, _ name: String, _ kind: FileWrapper.Kind,
            _ permissions: Int, target: String? = nil, xattrs: [String: Data] = [:]
        ) -> NodeRecord {
            NodeRecord(
                id: id, document: info.id, parent: parent, name: name, kind: kind,
                permissions: permissions, modified: modified, linkTarget: target,
                extendedAttributes: xattrs)
        }
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.origin = "test"
        changes.nodes = [
            record(
                notes, info.root, "notes.txt", .regularFile, 0o640,
                xattrs: ["user.color": Data("blue".utf8), "user.tag": Data("draft".utf8)]),
            record(src, info.root, "src", .directory, 0o755),
            record(main, src, "main.swift", .regularFile, 0o755),
            record(deep, src, "deep", .directory, 0o700),
            record(deeper, deep, "deeper", .directory, 0o755),
            record(leaf, deeper, "leaf.txt", .regularFile, 0o644),
            record(link, info.root, "main-link", .symbolicLink, 0o777, target: "src/main.swift"),
            record(big, info.root, "big.bin", .regularFile, 0o600),
        ]
        changes.contents = [
            notes: .replace(DataContentsSource(Data("Notes with ünïcode.\nSecond line.\n".utf8))),
            main: .replace(DataContentsSource(Data("print(\"hello\")\n".utf8))),
            leaf: .replace(DataContentsSource(Data("leaf\n".utf8))),
            big: .replace(DataContentsSource(bigContents())),
        ]
        _ = try store.save(changes)
    }

    /// Nothing to do: the store goes with the last copy of the fixture (kept for the callers
    /// that remove it explicitly).
    func remove() {}

    /// The record of a wrapper by path inside a document (for expectations).
    func record(_ document: String, _ path: String...) throws -> NodeRecord {
        guard let info = try store.document(named: document) else { throw TestFailure("no \(document)") }
        let records = try store.nodes(of: info.id)
        var current = info.root
        for name in path {
            guard let next = records.first(where: { $0.parent == current && $0.name == name }) else {
                throw TestFailure("no \(name) in \(document)")
            }
            current = next.id
        }
        guard let found = records.first(where: { $0.id == current }) else { throw TestFailure("lost") }
        return found
    }
}

/// Copies a SQLite store's files (database, log, packs, intent logs) to a fresh folder, as a
/// killed process leaves them on disk, and runs `body` with the copy's store path; the copy is
/// removed after.
func withCrashImage<T>(of path: String, _ body: (String) throws -> T) throws -> T {
    let folder = try temporaryDirectory("docfs-image")
    defer { try? FileManager.default.removeItem(atPath: folder) }
    let copy = folder + "/" + (path as NSString).lastPathComponent
    let manager = FileManager.default
    for suffix in ["", "-wal", "-packs", "-intents"] where manager.fileExists(atPath: path + suffix) {
        try manager.copyItem(atPath: path + suffix, toPath: copy + suffix)
    }
    return try body(copy)
}
