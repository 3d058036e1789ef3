import Foundation
import DocumentEngine
import TestSupport

#if canImport(Glibc)
    import Glibc
#endif

/// A fresh directory under `base` (default: the system temporary directory), removed on deinit.
final class TemporaryDirectory {
    let url: URL

    init(base: String? = nil) throws {
        let root = base ?? FileManager.default.temporaryDirectory.path
        var template = Array("\(root)/docfs-test-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else {
            throw CocoaError(.fileWriteUnknown)
        }
        url = URL(fileURLWithPath: String(cString: made), isDirectory: true)
    }

    deinit { try? FileManager.default.removeItem(at: url) }

    var path: String { url.path }

    func url(_ relative: String) -> URL { url.appendingPathComponent(relative) }

    func path(_ relative: String) -> String { url(relative).path }

    @discardableResult
    func write(_ relative: String, _ contents: String) throws -> URL {
        try write(relative, Data(contents.utf8))
    }

    @discardableResult
    func write(_ relative: String, _ contents: Data) throws -> URL {
        let target = url(relative)
        try FileManager.default.createDirectory(
            at: target.deletingLastPathComponent(), withIntermediateDirectories: true)
        try contents.write(to: target)
        return target
    }

    func mkdir(_ relative: String) throws {
        try FileManager.default.createDirectory(at: url(relative), withIntermediateDirectories: true)
    }

    func entries(_ relative: String = "") throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: relative.isEmpty ? path : path(relative)).sorted()
    }
}

/// stat(2) facts the tests compare.
struct FileFacts: Equatable {
    var inode: UInt64
    var links: UInt64
    var mode: UInt32
    var size: Int64
    var mtime: Date

    init(_ path: String) throws {
        var st = stat()
        guard lstat(path, &st) == 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
        inode = UInt64(st.st_ino)
        links = UInt64(st.st_nlink)
        mode = UInt32(st.st_mode)
        size = Int64(st.st_size)
        // Through the reference date, the way the engine converts, to keep a Date's full precision.
        mtime = Date(
            timeIntervalSinceReferenceDate: TimeInterval(st.st_mtim.tv_sec - 978_307_200)
                + TimeInterval(st.st_mtim.tv_nsec) / 1e9)
    }

    var permissions: Int { Int(mode & 0o7777) }
}

/// Sets a file's modification time.
func setModificationDate(_ path: String, _ date: Date) throws {
    try FileManager.default.setAttributes([.modificationDate: date], ofItemAtPath: path)
}


/// The process umask, read without changing it.
func processUmask() -> Int {
    let status = readSystemFile("/proc/self/status") ?? ""
    for line in status.split(separator: "\n") where line.hasPrefix("Umask:") {
        return Int(line.dropFirst(6).trimmingCharacters(in: .whitespaces), radix: 8) ?? 0o022
    }
    return 0o022
}
