import DocumentEngine
import SQLiteStore
import Foundation
import Testing
import TestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// What one run of `docfs` did.
struct DocfsResult: CustomStringConvertible {
    var status: Int32
    var stdout: String
    var stderr: String

    /// Standard output's lines, without the empty last one.
    var lines: [String] {
        stdout.split(separator: "\n", omittingEmptySubsequences: false).map(String.init).filter {
            !$0.isEmpty
        }
    }

    /// Standard error's lines.
    var errorLines: [String] { stderr.split(separator: "\n").map(String.init) }

    var description: String { "exit \(status)\nstdout:\n\(stdout)\nstderr:\n\(stderr)" }
}

/// A private temporary home for one test: `HOME` and the XDG folders of the `docfs` child
/// processes point into it, so the default store is the test's own. Removed on deinit.
final class Sandbox: Sendable {
    let url: URL

    init() throws {
        var template = Array("\(FileManager.default.temporaryDirectory.path)/docfs-cli-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        url = URL(fileURLWithPath: String(cString: made), isDirectory: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    var path: String { url.path }

    func path(_ relative: String) -> String { url.appendingPathComponent(relative).path }

    /// Where `docfs` puts the default store for this sandbox.
    var defaultStore: String { path("home/.local/share/docfs/Documents/Default.docstore") }

    /// The child's environment: the test's, with the home and XDG folders in the sandbox.
    var environment: [String: String] {
        var environment = ProcessInfo.processInfo.environment
        environment["HOME"] = path("home")
        for name in ["XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"] {
            environment.removeValue(forKey: name)
        }
        environment["XDG_DATA_HOME"] = path("home/.local/share")
        return environment
    }

    /// The pid file a daemon serving `mountpoint` keeps in the sandbox's state folder.
    func pidFile(_ mountpoint: String) -> String {
        let name = mountpoint.replacingOccurrences(of: "%", with: "%25").replacingOccurrences(of: "/", with: "%2F")
        return path("home/.local/state/docfs/mounts/\(name).pid")
    }

    /// The pid in the pid file for `mountpoint`.
    func daemonPID(_ mountpoint: String) -> pid_t? {
        guard let text = try? String(contentsOfFile: pidFile(mountpoint), encoding: .utf8) else { return nil }
        return text.split(separator: " ").first.flatMap { pid_t($0) }
    }

    /// The daemons' log.
    var daemonLog: String {
        (try? String(contentsOfFile: path("home/.local/state/docfs/docfs.log"), encoding: .utf8)) ?? ""
    }

    /// Sends `kill -USR1` to the daemon `pid` and returns the store statistics it then logs
    /// (content bytes read and written since it started), or nil if no line came within 10 s.
    func storeStatistics(of pid: pid_t) -> (bytesRead: Int, bytesWritten: Int)? {
        func lines() -> [Substring] {
            daemonLog.split(separator: "\n").filter { $0.contains("pid=\(pid) ") && $0.contains("store statistics:") }
        }
        let before = lines().count
        guard kill(pid, SIGUSR1) == 0 else { return nil }
        let deadline = Date().addingTimeInterval(10)
        while Date() < deadline {
            if let line = lines().dropFirst(before).last {
                func value(_ name: String) -> Int? {
                    guard let range = line.range(of: " \(name)=") else { return nil }
                    return Int(line[range.upperBound...].prefix { $0.isNumber })
                }
                guard let read = value("bytesRead"), let written = value("bytesWritten") else { return nil }
                return (read, written)
            }
            usleep(20_000)
        }
        return nil
    }

    @discardableResult
    func write(_ relative: String, _ contents: Data) throws -> String {
        let target = url.appendingPathComponent(relative)
        try FileManager.default.createDirectory(
            at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
        try contents.write(to: target)
        return target.path
    }

    /// Runs `docfs` with `arguments`; with `prefix`, runs `prefix + [docfs] + arguments` (to run
    /// it as another user). Output goes through files, so a chatty child cannot fill a pipe.
    func run(
        _ arguments: [String], prefix: [String] = [], environment extra: [String: String] = [:],
        directory: String? = nil
    ) throws -> DocfsResult {
        let program = try #require(
            Docfs.program, "docfs is not built next to the tests; run `swift build --build-tests`")
        return try execute(prefix + [program.path] + arguments, environment: extra, directory: directory)
    }

    /// Runs `command` (a program's path, then its arguments) to completion in the sandbox's
    /// environment plus `extra`.
    func execute(
        _ command: [String], environment extra: [String: String] = [:], directory: String? = nil
    ) throws -> DocfsResult {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: command[0])
        process.arguments = Array(command.dropFirst())
        process.environment = environment.merging(extra) { $1 }
        process.currentDirectoryURL = URL(fileURLWithPath: directory ?? path)
        let outPath = path("stdout-\(UUID().uuidString)")
        let errPath = path("stderr-\(UUID().uuidString)")
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        defer {
            try? FileManager.default.removeItem(atPath: outPath)
            try? FileManager.default.removeItem(atPath: errPath)
        }
        let out = try FileHandle(forWritingTo: URL(fileURLWithPath: outPath))
        let err = try FileHandle(forWritingTo: URL(fileURLWithPath: errPath))
        process.standardOutput = out
        process.standardError = err
        process.standardInput = FileHandle.nullDevice
        try process.run()
        process.waitUntilExit()
        try out.close()
        try err.close()
        return DocfsResult(
            status: process.terminationStatus,
            stdout: String(decoding: try Data(contentsOf: URL(fileURLWithPath: outPath)), as: UTF8.self),
            stderr: String(decoding: try Data(contentsOf: URL(fileURLWithPath: errPath)), as: UTF8.self))
    }
}

enum Docfs {
    /// The `docfs` program, built next to the test bundle by `swift build --build-tests`
    /// (found the way the store tests find `store-torture`).
    static let program: URL? = {
        let candidates = [
            URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent(),
            Bundle.main.bundleURL,
            Bundle.main.bundleURL.deletingLastPathComponent(),
        ]
        return candidates.map { $0.appendingPathComponent("docfs") }.first {
            FileManager.default.isExecutableFile(atPath: $0.path)
        }
    }()
}

/// Runs the sqlite3 command on `path`; returns its output.
@discardableResult
func sqlite(_ path: String, _ sql: String) throws -> String {
    let process = Process()
    process.executableURL = URL(fileURLWithPath: "/usr/bin/sqlite3")
    process.arguments = ["-bail", path, sql]
    let output = Pipe()
    process.standardOutput = output
    try process.run()
    let data = output.fileHandleForReading.readDataToEndOfFile()
    process.waitUntilExit()
    guard process.terminationStatus == 0 else { throw DocumentStoreError.io("sqlite3 failed: \(sql)") }
    return String(decoding: data, as: UTF8.self)
}


extension SQLiteStore {
    /// A regular file's whole contents.
    func wholeContents(of id: StoreNodeID, at version: VersionID? = nil) throws -> Data {
        let size = try #require(try node(id, at: version)).size
        return try readContents(of: id, at: version, offset: 0, count: Int(size))
    }

    /// Replaces a flat document's contents in one save, as an app would.
    @discardableResult
    func replaceContents(of name: String, with data: Data) throws -> SaveResult {
        let info = try #require(try document(named: name))
        var record = try #require(try node(info.root))
        record.size = Int64(data.count)
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.nodes = [record]
        changes.contents[info.root] = .replace(DataContentsSource(data))
        changes.origin = "DocfsTests"
        return try save(changes)
    }
}

/// The permission bits of `path`, not following links.
func permissions(_ path: String) -> Int {
    var st = stat()
    return lstat(path, &st) == 0 ? Int(st.st_mode & 0o7777) : -1
}
