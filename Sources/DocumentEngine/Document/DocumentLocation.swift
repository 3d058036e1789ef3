import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Where a document lives: a file or package folder on disk, or a document in a store.
public enum DocumentLocation: Sendable {
    /// A flat file or a package folder.
    case file(URL)
    /// The document named `name` in `store`. Its `fileURL` reads as `<store path>/<name>`.
    case store(any DocumentStore, name: String)

    /// The URL Apple's API expects: the file's URL, or `<store path>/<name>` for a store document.
    public var url: URL {
        switch self {
        case .file(let url): return url
        case .store(let store, let name):
            return URL(fileURLWithPath: store.location).appendingPathComponent(name)
        }
    }
}

/// A cheap fingerprint of an item on disk that changes when any part of it is rewritten, renamed,
/// added or removed: (name, inode, size, mtime) of every entry, depth first, never following links.
struct DiskSignature: Equatable, Sendable {
    private var entries: [String] = []

    init(of url: URL) {
        collect(url.path, name: url.lastPathComponent, depth: 0)
    }

    private mutating func collect(_ path: String, name: String, depth: Int) {
        guard let st = try? POSIX.lstat(path) else {
            entries.append("\(name) missing")
            return
        }
        entries.append(
            "\(name) \(st.st_ino) \(st.st_size) \(st.st_mtim.tv_sec).\(st.st_mtim.tv_nsec) \(st.st_mode)")
        guard (st.st_mode & S_IFMT) == S_IFDIR, depth < 64,
            let children = try? FileManager.default.contentsOfDirectory(atPath: path)
        else { return }
        for child in children.sorted() { collect(path + "/" + child, name: child, depth: depth + 1) }
    }

    /// The item's modification date, if it exists.
    static func modificationDate(of url: URL) -> Date? {
        (try? POSIX.lstat(url.path))?.modificationDate
    }
}
