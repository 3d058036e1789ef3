import DocumentEngine
import DocumentFS
import Foundation
import SQLiteStore
import StoreTestSupport
import SystemPackage
import TestSupport
import Testing
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

// Helpers of the write-path suites (EditorSaveTests, ToolTests, PosixSemanticsTests,
// SharedStoreTests): a small store, a second store connection to check results through the
// engine, the editors' scratch-name patterns, and syscall wrappers.

extension Fixture {
    static let notesText = "one\ntwo\nthree\n"
    static let innerText = "inner\n"
    static let flatText = "alpha\nbeta\n"
    static let otherText = "other\n"

    /// A small store for the write tests (a few KiB, made in milliseconds):
    ///
    /// - `Work.pkg/` (0755): `notes.txt` (0640, xattr `user.color=blue`), `sub/` (0755) with
    ///   `inner.txt` (0644), and `link` → `notes.txt`;
    /// - `Other.pkg/` (0755): `other.txt` (0644);
    /// - `Flat.txt` (0644), a flat document.
    static func small(_ kind: StoreKind = .sqlite) throws -> Fixture {
        let stores = try StoreFixture(kind, chunkSize: chunkSize, name: "S")
        let store = stores.store
        let work = try store.createDocument(
            named: "Work.pkg", kind: .package, type: nil, permissions: 0o755, origin: "test")
        let ids = try store.makeNodeIDs(count: 5)
        let (notes, sub, inner, link, other) = (ids[0], ids[1], ids[2], ids[3], ids[4])
        func record(
            _ id: StoreNodeID, _ document: DocumentInfo, _ parent: StoreNodeID, _ name: String,
            _ kind: FileWrapper.Kind, _ permissions: Int, target: String? = nil, xattrs: [String: Data] = [:]
        ) -> NodeRecord {
            NodeRecord(
                id: id, document: document.id, parent: parent, name: name, kind: kind,
                permissions: permissions, modified: modified, linkTarget: target, extendedAttributes: xattrs)
        }
        var changes = DocumentChanges(document: work.id, base: work.currentVersion)
        changes.origin = "test"
        changes.nodes = [
            record(
                notes, work, work.root, "notes.txt", .regularFile, 0o640,
                xattrs: ["user.color": Data("blue".utf8)]),
            record(sub, work, work.root, "sub", .directory, 0o755),
            record(inner, work, sub, "inner.txt", .regularFile, 0o644),
            record(link, work, work.root, "link", .symbolicLink, 0o777, target: "notes.txt"),
        ]
        changes.contents = [
            notes: .replace(DataContentsSource(Data(notesText.utf8))),
            inner: .replace(DataContentsSource(Data(innerText.utf8))),
        ]
        _ = try store.save(changes)

        let otherPackage = try store.createDocument(
            named: "Other.pkg", kind: .package, type: nil, permissions: 0o755, origin: "test")
        var otherChanges = DocumentChanges(document: otherPackage.id, base: otherPackage.currentVersion)
        otherChanges.origin = "test"
        otherChanges.nodes = [
            record(other, otherPackage, otherPackage.root, "other.txt", .regularFile, 0o644)
        ]
        otherChanges.contents = [other: .replace(DataContentsSource(Data(otherText.utf8)))]
        _ = try store.save(otherChanges)

        let flat = try store.createDocument(
            named: "Flat.txt", kind: .flat, type: nil, permissions: 0o644, origin: "test")
        var flatChanges = DocumentChanges(document: flat.id, base: flat.currentVersion)
        flatChanges.origin = "test"
        flatChanges.contents = [flat.root: .replace(DataContentsSource(Data(flatText.utf8)))]
        _ = try store.save(flatChanges)
        return Fixture(stores: stores)
    }
}

/// The store file seen from another process (an app): a second `SQLiteStore` on the same file.
/// Every result of a write through the mount is checked here, through the engine.
struct Engine {
    let store: any VersionedDocumentStore

    init(_ fixture: Fixture) throws { store = try fixture.reopen() }

    func document(_ name: String) throws -> DocumentInfo {
        guard let info = try store.document(named: name) else { throw TestFailure("no document \(name)") }
        return info
    }

    /// Names of the live documents, sorted.
    func documentNames() throws -> [String] { try store.documents().map(\.name).sorted() }

    /// The records of a document by path relative to the document ("" is the root), at `version`.
    func tree(_ name: String, at version: VersionID? = nil) throws -> [String: NodeRecord] {
        try tree(of: try document(name).id, at: version)
    }

    func tree(of document: DocumentID, at version: VersionID? = nil) throws -> [String: NodeRecord] {
        let records = try store.nodes(of: document, at: version)
        let byID = Dictionary(records.map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        var result: [String: NodeRecord] = [:]
        for record in records {
            var components: [String] = []
            var current: NodeRecord? = record
            var depth = 0
            while let node = current, let parent = node.parent, depth < 100 {
                components.append(node.name)
                current = byID[parent]
                depth += 1
            }
            result[components.reversed().joined(separator: "/")] = record
        }
        return result
    }

    /// Paths of the wrappers of a package (not the root), sorted.
    func paths(_ name: String) throws -> [String] { try tree(name).keys.filter { !$0.isEmpty }.sorted() }

    func record(_ name: String, _ path: String = "") throws -> NodeRecord? { try tree(name)[path] }

    /// The contents of a regular file (`path` "" for a flat document), or nil if there is none.
    func contents(_ name: String, _ path: String = "", at version: VersionID? = nil) throws -> Data? {
        guard let record = try tree(name, at: version)[path], record.kind == .regularFile else { return nil }
        return try store.readContents(of: record.id, at: version, offset: 0, count: Int(record.size) + 1)
    }

    func text(_ name: String, _ path: String = "") throws -> String? {
        try contents(name, path).map { String(decoding: $0, as: UTF8.self) }
    }

    func versions(_ name: String) throws -> [VersionInfo] { try store.versions(of: try document(name).id) }

    /// Saves `text` as the contents of `path` in package `name`, as another process would (on
    /// the current version, with a new mtime).
    func replaceText(_ name: String, _ path: String, with text: String) throws {
        let info = try document(name)
        guard var record = try record(name, path) else { throw TestFailure("no \(path) in \(name)") }
        record.modified = .now
        var changes = DocumentChanges(document: info.id, base: info.currentVersion)
        changes.nodes = [record]
        changes.contents = [record.id: .replace(DataContentsSource(Data(text.utf8)))]
        changes.origin = "another process"
        _ = try store.save(changes)
    }

    /// Every scratch name the store holds anywhere: as a live or deleted document, or as a
    /// wrapper in any version of any document. Must always be empty (docs/design/fuse-notes.md §3.4: scratch
    /// files are real files in the mount but never become wrappers).
    func scratchNamesInStore() throws -> [String] {
        var found: [String] = []
        let documents = try store.documents() + store.deletedDocuments()
        for info in documents {
            if isScratchName(info.name) { found.append("document \(info.name)") }
            for version in try store.versions(of: info.id) {
                for record in try store.nodes(of: info.id, at: version.id)
                where record.parent != nil && isScratchName(record.name) {
                    found.append("\(info.name): \(record.name) in \(version.id)")
                }
            }
        }
        return found
    }
}

/// docs/design/fuse-notes.md §3.1–§3.4: the names editors and tools use for swap, backup, lock,
/// auto-save and temporary files. Written independently of the file system's own list.
let scratchPatterns = [
    ".*.sw?", "*~", "#*#", ".#*", ".goutputstream-*", "sed??????", ".~lock.*#", "lu*.tmp", "*.kate-swp",
    // File managers' housekeeping files.
    ".DS_Store", "._*", "Thumbs.db", "desktop.ini",
]

func isScratchName(_ name: String) -> Bool {
    if scratchPatterns.contains(where: { fnmatch($0, name, 0) == 0 }) { return true }
    // vim's probe files: 4913, 5036, 5159, … (docs/design/fuse-notes.md §3.1.2).
    if let number = Int(name), number >= 4913, (number - 4913) % 123 == 0 { return true }
    return false
}

/// Every scratch name under `directory` in the mount (recursively), relative paths.
func scratchFiles(under directory: String) -> [String] {
    guard let enumerator = FileManager.default.enumerator(atPath: directory) else { return [] }
    var found: [String] = []
    while let relative = enumerator.nextObject() as? String {
        if isScratchName((relative as NSString).lastPathComponent) { found.append(relative) }
    }
    return found.sorted()
}

/// Names in one directory of the mount (no recursion), sorted.
func entries(in directory: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
}

// MARK: - Syscalls

/// Calls a libc function that returns -1 and sets errno on failure.
@discardableResult
func sys(_ rc: Int32, _ what: @autoclosure () -> String = "") throws -> Int32 {
    if rc < 0 { throw SyscallError(errno: errno, what: what()) }
    return rc
}

@discardableResult
func sys(_ rc: Int, _ what: @autoclosure () -> String = "") throws -> Int {
    if rc < 0 { throw SyscallError(errno: errno, what: what()) }
    return rc
}

struct SyscallError: Error, CustomStringConvertible {
    var errno: Int32
    var what: String
    var description: String { "\(what): \(String(cString: strerror(errno))) (errno \(errno))" }
}

/// The errno a syscall fails with, or 0 if it succeeds.
func errnoOf(_ rc: Int32) -> Int32 { rc < 0 ? errno : 0 }

/// Opens with O_CLOEXEC (a child another suite starts must not inherit a descriptor on a mount).
func openFile(_ path: String, _ flags: Int32, _ mode: mode_t = 0o644) throws -> Int32 {
    try sys(open(path, flags | O_CLOEXEC, mode), "open \(path)")
}

/// A descriptor on the mount that is closed exactly once: by ``close()``, or when the object
/// goes away. (A second close(2) of a number another thread has since been given closes that
/// thread's file: a store's SQLite file or a session's /dev/fuse.)
final class OpenedFile: @unchecked Sendable {
    private(set) var fd: Int32

    init(_ path: String, _ flags: Int32, _ mode: mode_t = 0o644) throws {
        fd = try openFile(path, flags, mode)
    }

    /// close(2) the first time (its result, errno set on -1); 0 afterwards.
    @discardableResult
    func close() -> Int32 {
        guard fd >= 0 else { return 0 }
        let descriptor = fd
        fd = -1
        return Glibc.close(descriptor)
    }

    deinit {
        if fd >= 0 { Glibc.close(fd) }
    }
}

func writeAll(_ fd: Int32, _ text: String) throws {
    let bytes = Array(text.utf8)
    let n = try sys(write(fd, bytes, bytes.count), "write")
    if n != bytes.count { throw TestFailure("short write \(n) of \(bytes.count)") }
}

func pwriteAll(_ fd: Int32, _ bytes: [UInt8], at offset: Int) throws {
    let n = try sys(pwrite(fd, bytes, bytes.count, off_t(offset)), "pwrite")
    if n != bytes.count { throw TestFailure("short pwrite \(n) of \(bytes.count)") }
}

/// `count` bytes at `offset` (fewer at the end of the file).
func preadBytes(_ fd: Int32, count: Int, at offset: Int) throws -> [UInt8] {
    var buffer = [UInt8](repeating: 0, count: count)
    var total = 0
    while total < count {
        let n = try buffer.withUnsafeMutableBytes { raw in
            try sys(pread(fd, raw.baseAddress! + total, count - total, off_t(offset + total)), "pread")
        }
        if n == 0 { break }
        total += n
    }
    return Array(buffer[..<total])
}

/// Writes a whole file through the mount (create or truncate), then closes it.
func writeText(_ path: String, _ text: String, mode: mode_t = 0o644) throws {
    let fd = try openFile(path, O_WRONLY | O_CREAT | O_TRUNC, mode)
    do { try writeAll(fd, text) } catch {
        close(fd)
        throw error
    }
    try sys(close(fd), "close \(path)")
}

func statOf(_ path: String) throws -> stat {
    var st = stat()
    try sys(stat(path, &st), "stat \(path)")
    return st
}

func fstatOf(_ fd: Int32) throws -> stat {
    var st = stat()
    try sys(fstat(fd, &st), "fstat")
    return st
}

/// Seconds and nanoseconds of a timespec, comparable.
struct FileTime: Equatable, CustomStringConvertible {
    var seconds: Int
    var nanoseconds: Int
    init(_ ts: timespec) {
        seconds = ts.tv_sec
        nanoseconds = ts.tv_nsec
    }
    init(_ timestamp: Timestamp) {
        seconds = Int(timestamp.seconds)
        nanoseconds = Int(timestamp.nanoseconds)
    }
    var description: String { "\(seconds).\(String(format: "%09d", nanoseconds))" }
}

/// A fresh local (non-FUSE) directory for sources of copies, removed by the caller.
func localDirectory() throws -> String { try temporaryDirectory("docfs-local") }

/// Shell-quotes a string.
func quoted(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "'\\''") + "'" }

/// Waits (off the pool) until `condition` holds, up to `timeout` seconds; the seconds it took.
func waitUntil(timeout: Double, _ condition: @escaping @Sendable () throws -> Bool) async throws -> Double? {
    try await offThread { eventually(timeout: timeout, condition) }
}

/// A child process (perl, under `timeout`) that holds one file open for writing and obeys lines
/// on its standard input: `write TEXT` (at offset 0, or at the end with O_APPEND), `close`. Each
/// answers one line ("ok" or "error …"). The descriptor lives in the child: a program this
/// process spawns gets a copy of every descriptor of the process, and the kernel closes that
/// copy at exec with a FLUSH, which is a save point. Tests that count saves of a file open for
/// writing hold it here, out of reach of the other suites' spawns.
final class FileHolder: @unchecked Sendable {
    private let process = Process()
    private let input = Pipe()
    private let output = Pipe()

    /// `flags`: a perl expression of Fcntl constants, like `O_WRONLY|O_APPEND`.
    init(_ path: String, flags: String = "O_RDWR") throws {
        let script = """
            use Fcntl; $| = 1;
            sysopen(my $fh, $ARGV[0], eval $ARGV[1]) or die "open: $!";
            print "ok\\n";
            while (my $line = <STDIN>) {
              chomp $line;
              if ($line =~ /^write (.*)$/) { sysseek($fh, 0, 0); print((syswrite($fh, $1) // -1) == length($1) ? "ok\\n" : "error $!\\n"); }
              elsif ($line eq "close") { print(close($fh) ? "ok\\n" : "error $!\\n"); }
            }
            """
        process.executableURL = URL(fileURLWithPath: "/bin/sh")
        process.arguments = timedCommand("/usr/bin/perl", ["-e", script, path, flags], seconds: childTimeout)
        process.standardInput = input
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let first = try readLine()
        if first != "ok" { throw TestFailure("file holder: \(first)") }
    }

    private func readLine() throws -> String {
        var bytes: [UInt8] = []
        while true {
            let data = output.fileHandleForReading.readData(ofLength: 1)
            guard let byte = data.first else { throw TestFailure("file holder ended") }
            if byte == 0x0A { return String(decoding: bytes, as: UTF8.self) }
            bytes.append(byte)
        }
    }

    /// Sends one command and waits for its answer; throws unless it is "ok".
    func send(_ command: String) throws {
        input.fileHandleForWriting.write(Data((command + "\n").utf8))
        let answer = try readLine()
        if answer != "ok" { throw TestFailure("file holder, \(command): \(answer)") }
    }

    /// Ends the child (closing its descriptor if still open).
    func stop() {
        try? input.fileHandleForWriting.close()
        process.waitUntilExit()
    }
}
