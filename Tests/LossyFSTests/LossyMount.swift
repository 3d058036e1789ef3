import Foundation
import TestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

struct LossyFailure: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A `lossyfs` process serving a fresh backing folder: mount, cut the power, mount again.
final class LossyMount {
    /// `lossyfs`, built next to the test bundle by `swift build --build-tests`.
    static let program: String? = {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
            Bundle.main.bundleURL,
            Bundle.main.bundleURL.deletingLastPathComponent(),
        ]
        return candidates.map { $0.appendingPathComponent("lossyfs").path }.first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }()

    let folder: String
    var backing: String { folder + "/backing" }
    var mountpoint: String { folder + "/mnt" }
    let options: [String]
    private var process: Process?

    init(options: [String] = []) throws {
        var template = Array("/tmp/lossyfs-test.XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw LossyFailure("mkdtemp: \(errno)") }
        folder = String(cString: made)
        self.options = options
        try FileManager.default.createDirectory(atPath: backing, withIntermediateDirectories: false)
        try FileManager.default.createDirectory(atPath: mountpoint, withIntermediateDirectories: false)
        try mount()
    }

    deinit { close() }

    func path(_ name: String) -> String { mountpoint + "/" + name }

    /// A kernel file read whole: Foundation's `String(contentsOfFile:)` sizes its read by `stat`,
    /// which is 0 for /proc files, and returns only the first page, so a busy machine's newest
    /// mounts were missing from /proc/self/mounts.
    static func procText(_ path: String) -> String {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return "" }
        defer { Glibc.close(fd) }
        var bytes: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0, errno == EINTR { continue }
            guard n > 0 else { break }
            bytes += buffer[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func isMounted(_ path: String) -> Bool {
        procText("/proc/self/mounts")
            .split(separator: "\n").contains {
                $0.split(separator: " ").dropFirst().first.map(String.init) == path
            }
    }

    /// Starts `lossyfs BACKING MOUNTPOINT` and waits until the mount answers.
    func mount() throws {
        guard let program = Self.program else { throw LossyFailure("lossyfs is not built") }
        let process = Process()
        process.executableURL = URL(fileURLWithPath: program)
        process.arguments = [backing, mountpoint] + options
        if !FileManager.default.fileExists(atPath: folder + "/log") {
            _ = FileManager.default.createFile(atPath: folder + "/log", contents: nil)
        }
        let errors = try FileHandle(forWritingTo: URL(fileURLWithPath: folder + "/log"))
        errors.seekToEndOfFile()
        process.standardError = errors
        try process.run()
        self.process = process
        // Generous: the whole suite mounts many file systems at once on two cores.
        let deadline = Date().addingTimeInterval(60)
        while !Self.isMounted(mountpoint) {
            guard Date() < deadline, process.isRunning else {
                throw LossyFailure(
                    "lossyfs did not mount (\(process.isRunning ? "still running: \(Self.whereStuck(process.processIdentifier))" : "exited \(process.terminationStatus)")): \(readLog())"
                )
            }
            usleep(10_000)
        }
        var st = stat()
        _ = lstat(mountpoint, &st)
    }

    /// Where each thread of `pid` waits in the kernel, for a mount that never comes.
    static func whereStuck(_ pid: Int32) -> String {
        let tasks = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/task")) ?? []
        return tasks.sorted().map { task in
            let base = "/proc/\(pid)/task/\(task)/"
            let state =
                procText(base + "stat")
                .split(separator: " ").dropFirst(2).first.map(String.init) ?? "?"
            let stack = procText(base + "stack")
                .split(separator: "\n").prefix(6).joined(separator: " < ")
            return "thread \(task) [\(state)] \(stack)"
        }.joined(separator: "; ")
    }

    func readLog() -> String { (try? String(contentsOfFile: folder + "/log", encoding: .utf8)) ?? "" }

    /// Cuts the power (SIGUSR1) and waits until lossyfs has exited and the mount is gone.
    func cut() throws {
        guard let process else { throw LossyFailure("not mounted") }
        kill(process.processIdentifier, SIGUSR1)
        process.waitUntilExit()
        self.process = nil
        guard process.terminationStatus == 0 else {
            throw LossyFailure("lossyfs exited \(process.terminationStatus)")
        }
        guard !Self.isMounted(mountpoint) else { throw LossyFailure("still mounted after the cut") }
    }

    /// Sends `signal` to lossyfs and waits until its log has a line containing `line`.
    func signal(_ signal: Int32, until line: String) throws {
        guard let process else { throw LossyFailure("not mounted") }
        let before = readLog().components(separatedBy: line).count
        kill(process.processIdentifier, signal)
        let deadline = Date().addingTimeInterval(10)
        while readLog().components(separatedBy: line).count == before {
            guard Date() < deadline else { throw LossyFailure("lossyfs never logged \(line)") }
            usleep(10_000)
        }
    }

    /// A power cut, then a mount of the same backing folder (a reboot).
    func cutAndRemount() throws {
        try cut()
        try mount()
    }

    /// A clean unmount (SIGTERM): lossyfs makes everything durable and exits.
    func unmount() throws {
        guard let process else { throw LossyFailure("not mounted") }
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
        self.process = nil
        guard process.terminationStatus == 0 else {
            throw LossyFailure("lossyfs exited \(process.terminationStatus)")
        }
        guard !Self.isMounted(mountpoint) else { throw LossyFailure("still mounted after SIGTERM") }
    }

    /// A clean unmount, then removes the folder.
    func close() {
        if let process, process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            process.waitUntilExit()
        }
        process = nil
        if Self.isMounted(mountpoint) { _ = try? run("/bin/fusermount3", ["-u", "-z", mountpoint]) }
        // The limbo folder (backing.lossyfs-limbo) is in it too.
        try? FileManager.default.removeItem(atPath: folder)
    }
}

// MARK: - System calls on the mount

enum Sync { case none, fsync, fdatasync }

@discardableResult
func check(_ result: Int32, _ what: String) throws -> Int32 {
    if result < 0 { throw LossyFailure("\(what): \(String(cString: strerror(errno)))") }
    return result
}

/// Writes `bytes` at `offset` of `path` (created if missing, never truncated), then syncs.
func write(_ path: String, _ bytes: [UInt8], at offset: Int = 0, sync: Sync = .none, truncate: Bool = false)
    throws
{
    let fd = try check(open(path, O_RDWR | O_CREAT | (truncate ? O_TRUNC : 0), 0o644), "open \(path)")
    defer { Glibc.close(fd) }
    guard pwrite(fd, bytes, bytes.count, off_t(offset)) == bytes.count else {
        throw LossyFailure("pwrite \(path)")
    }
    switch sync {
    case .none: break
    case .fsync: try check(fsync(fd), "fsync \(path)")
    case .fdatasync: try check(fdatasync(fd), "fdatasync \(path)")
    }
}

func write(_ path: String, _ text: String, sync: Sync = .none) throws {
    try write(path, Array(text.utf8), sync: sync, truncate: true)
}

/// The file's bytes, or nil when it does not exist.
func contents(_ path: String) -> [UInt8]? {
    FileManager.default.contents(atPath: path).map { Array($0) }
}

func text(_ path: String) -> String? { contents(path).map { String(decoding: $0, as: UTF8.self) } }

func fsyncDirectory(_ path: String) throws {
    let fd = try check(open(path, O_RDONLY | O_DIRECTORY), "open \(path)")
    defer { Glibc.close(fd) }
    try check(fsync(fd), "fsync \(path)")
}

/// Runs `sqlite3 -bail PATH SQL` and returns its output.
func sqlite(_ path: String, _ sql: String) throws -> String {
    // A busy timeout: another connection may hold the database for a moment (the reader below).
    let result = try run("/usr/bin/sqlite3", ["-bail", "-cmd", ".timeout 5000", path, sql])
    guard result.status == 0 else { throw LossyFailure("sqlite3: \(result.error)") }
    return result.output.trimmingCharacters(in: .whitespacesAndNewlines)
}

/// renameat2(RENAME_EXCHANGE), looked up at run time: Swift's Glibc does not declare it.
func exchange(_ a: String, _ b: String) throws {
    typealias Function =
        @convention(c) (Int32, UnsafePointer<CChar>?, Int32, UnsafePointer<CChar>?, UInt32) -> Int32
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "renameat2") else {
        throw LossyFailure("no renameat2")
    }
    try check(unsafeBitCast(symbol, to: Function.self)(AT_FDCWD, a, AT_FDCWD, b, 2), "exchange")
}

/// A libc function Swift's Glibc does not declare (it needs _GNU_SOURCE), looked up at run time.
func libc<F>(_ name: String, as type: F.Type) -> F {
    guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), name) else {
        fatalError("libc has no \(name)")
    }
    return unsafeBitCast(symbol, to: type)
}
