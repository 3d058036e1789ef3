import Foundation
import SystemPackage

/// Errors from reading, writing and decoding file wrappers. Each names the path or value at fault.
public enum FileWrapperError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// Reading `path` failed with `errno`.
    case readFailed(path: String, Errno)
    /// Writing `path` failed with `errno`.
    case writeFailed(path: String, Errno)
    /// A lazily read file changed or disappeared before its contents were loaded.
    case contentsChangedOnDisk(path: String)
    /// The item is neither a regular file, a directory nor a symbolic link.
    case unsupportedFileType(path: String)
    /// The item is not a regular file.
    case notARegularFile(path: String)
    /// A directory entry's name is not valid UTF-8, so it cannot become a wrapper key.
    case nameNotUTF8(directory: String, escapedName: String)
    /// A name cannot be used as a file name (empty, ".", "..", contains "/" or NUL, over 255 bytes).
    case invalidFilename(String, reason: String)
    /// A read was asked for a negative offset or count.
    case invalidRange(offset: Int64, count: Int)
    /// Contents too large to hold in memory as one `Data`.
    case contentsTooLarge(Int64)
    /// A wrapper that is needed for a write could not load its contents earlier (W-10).
    case missingContents(path: String, reason: String)
    /// A serialized representation is malformed.
    case corruptSerializedRepresentation(reason: String, offset: Int)
    /// The tree cannot be put into the serialized format (too deep, a cycle, a link destination
    /// with NUL, a date out of range).
    case cannotSerialize(reason: String)
    /// A serialized representation has a format version this program cannot read.
    case unsupportedSerializationVersion(UInt16)

    public var description: String {
        switch self {
        case .readFailed(let path, let e): return "cannot read \(path): \(e.description)"
        case .writeFailed(let path, let e): return "cannot write \(path): \(e.description)"
        case .contentsChangedOnDisk(let path):
            return "\(path) changed on disk after it was read; read the wrapper again"
        case .unsupportedFileType(let path):
            return "\(path) is not a regular file, directory or symbolic link"
        case .notARegularFile(let path): return "\(path) is not a regular file"
        case .nameNotUTF8(let directory, let name):
            return "\(directory) contains an entry whose name is not valid UTF-8: \(name)"
        case .invalidFilename(let name, let reason):
            return "invalid file name \(name.debugDescription): \(reason)"
        case .invalidRange(let offset, let count): return "invalid range: offset \(offset), count \(count)"
        case .contentsTooLarge(let size): return "contents of \(size) bytes are too large to load at once"
        case .missingContents(let path, let reason):
            return "cannot write \(path): its contents could not be read: \(reason)"
        case .corruptSerializedRepresentation(let reason, let offset):
            return "corrupt serialized file wrapper at byte \(offset): \(reason)"
        case .cannotSerialize(let reason): return "cannot serialize the file wrapper: \(reason)"
        case .unsupportedSerializationVersion(let v):
            return
                "serialized file wrapper has format version \(v); this program reads version \(FileWrapper.serializationVersion)"
        }
    }

    public var errorDescription: String? { description }
}

/// File-name rules for wrapper keys and preferred names that are written to disk.
public enum FileName {
    /// Linux's NAME_MAX.
    public static let maximumLength = 255

    /// Why `name` cannot be a file name in a package, or nil if it can.
    public static func problem(with name: String) -> String? {
        if name.isEmpty { return "it is empty" }
        if name == "." || name == ".." { return "it is a relative path component" }
        if name.utf8.contains(0x2F) { return "it contains a slash" }
        if name.utf8.contains(0) { return "it contains a NUL byte" }
        if name.utf8.count > maximumLength { return "it is longer than \(maximumLength) bytes" }
        return nil
    }

    /// Throws ``FileWrapperError/invalidFilename(_:reason:)`` unless `name` is a valid file name.
    public static func validate(_ name: String) throws {
        if let reason = problem(with: name) { throw FileWrapperError.invalidFilename(name, reason: reason) }
    }

    /// `bytes` as printable text with non-UTF-8 and control bytes escaped, for error messages.
    static func escaped(_ bytes: [UInt8]) -> String {
        bytes.map { b in
            (0x20..<0x7F).contains(b) && b != 0x5C ? String(UnicodeScalar(b)) : String(format: "\\x%02X", b)
        }.joined()
    }
}
