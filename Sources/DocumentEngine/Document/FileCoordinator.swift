import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Reader/writer coordination of files and packages across threads and processes (Linux has no
/// NSFileCoordinator). Readers share, writers exclude everyone (FC-1); reading or writing an item
/// inside a package coordinates the whole package (FC-2).
///
/// The lock is `flock(2)` on a lock file beside the item, `.<name>.docfs-lock`. flock locks belong
/// to open file descriptions, so two coordinators in one process exclude each other as two
/// processes do. A package is a directory whose name has an extension (PK-L1); the outermost one
/// on the item's path is locked. Accessors run on the calling thread, which blocks while waiting.
public final class FileCoordinator: Sendable {
    /// FC-7 raw values.
    public struct ReadingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let withoutChanges = ReadingOptions(rawValue: 1)
        public static let resolvesSymbolicLink = ReadingOptions(rawValue: 2)
        public static let immediatelyAvailableMetadataOnly = ReadingOptions(rawValue: 4)
        public static let forUploading = ReadingOptions(rawValue: 8)
    }

    /// FC-7 raw values.
    public struct WritingOptions: OptionSet, Sendable {
        public let rawValue: UInt
        public init(rawValue: UInt) { self.rawValue = rawValue }
        public static let forDeleting = WritingOptions(rawValue: 1)
        public static let forMoving = WritingOptions(rawValue: 2)
        public static let forMerging = WritingOptions(rawValue: 4)
        public static let forReplacing = WritingOptions(rawValue: 8)
        public static let contentIndependentMetadataOnly = WritingOptions(rawValue: 16)
    }

    public init() {}

    /// Runs `accessor` while no writer holds the item (or its package).
    public func coordinate<T>(
        readingItemAt url: URL, options: ReadingOptions = [], byAccessor accessor: (URL) throws -> T
    ) throws -> T {
        let target = options.contains(.resolvesSymbolicLink) ? url.resolvingSymlinksInPath() : url
        let lock = try Self.lock(for: target, exclusive: false)
        defer { close(lock) }
        return try accessor(target)
    }

    /// Runs `accessor` while nobody else reads or writes the item (or its package).
    public func coordinate<T>(
        writingItemAt url: URL, options: WritingOptions = [], byAccessor accessor: (URL) throws -> T
    ) throws -> T {
        let lock = try Self.lock(for: url, exclusive: true)
        defer { close(lock) }
        return try accessor(url)
    }

    /// The item whose lock guards `url`: its outermost enclosing package, or itself (FC-2).
    public static func coordinatedItem(for url: URL) -> URL {
        let components = url.standardizedFileURL.pathComponents
        var path = URL(fileURLWithPath: "/")
        for (index, component) in components.enumerated() where index > 0 {
            path.appendPathComponent(component)
            if index < components.count - 1, !component.hasPrefix("."),
                !(component as NSString).pathExtension.isEmpty,
                (try? POSIX.lstat(path.path)).map({ ($0.st_mode & S_IFMT) == S_IFDIR }) == true
            {
                return path
            }
        }
        return url.standardizedFileURL
    }

    /// Takes a shared or exclusive flock on the item's lock file; returns its descriptor.
    static func lock(for url: URL, exclusive: Bool) throws -> Int32 {
        let item = coordinatedItem(for: url)
        let lockPath = item.deletingLastPathComponent().appendingPathComponent(
            ".\(item.lastPathComponent).docfs-lock"
        ).path
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else {
            throw CocoaError(.fileWriteNoPermission, userInfo: [NSFilePathErrorKey: lockPath])
        }
        while flock(fd, exclusive ? LOCK_EX : LOCK_SH) != 0 {
            if errno == EINTR { continue }
            let error = errno
            close(fd)
            throw CocoaError(
                .fileLocking,
                userInfo: [
                    NSFilePathErrorKey: lockPath,
                    NSUnderlyingErrorKey: POSIXError(POSIXErrorCode(rawValue: error) ?? .EIO),
                ])
        }
        return fd
    }
}
