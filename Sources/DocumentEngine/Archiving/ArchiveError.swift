import Foundation

/// Errors from validating, decoding and encoding keyed archives. Each names what is wrong and where:
/// a location is a path into the archive such as `$objects[7]["next"]` or `$top["root"]`.
public enum ArchiveError: Error, Sendable, Equatable, CustomStringConvertible, LocalizedError {
    /// The data is larger than ``KeyedArchive/Limits/maximumSize``.
    case tooLarge(size: Int, limit: Int)
    /// The data is not a property list at all (truncated, random bytes, bad XML).
    case notAPropertyList(reason: String)
    /// The property list is in a format archives never use (OpenStep text).
    case unsupportedFormat(String)
    /// The property list is not a keyed archive (KA-1, KA-2): wrong or missing `$archiver`, `$version`,
    /// `$top` or `$objects`, or `$objects[0]` is not `"$null"`.
    case notAnArchive(reason: String)
    /// A value that must be a UID is not one, or names no entry of `$objects` (KA-3).
    case invalidReference(at: String, reason: String)
    /// An object's `$class` does not name a class dictionary, or a class dictionary is malformed (KA-4).
    case invalidClass(at: String, reason: String)
    /// A class the archive names is not in the allow-list.
    case classNotAllowed(String, at: String)
    /// A class name that names no class in this process, or cannot be a class name.
    case unknownClass(String, at: String)
    /// A class that is allowed but cannot be decoded securely: not an `NSObject` subclass, not
    /// `NSCoding`, or without `NSSecureCoding` support (SC-3, KL-2).
    case insecureClass(String, at: String, reason: String)
    /// The archive holds more objects than ``KeyedArchive/Limits/maximumObjectCount``.
    case tooManyObjects(count: Int, limit: Int)
    /// Objects nest deeper than ``KeyedArchive/Limits/maximumDepth``; decoding recurses once per level.
    case tooDeep(at: String, limit: Int)
    /// Objects refer to each other in a cycle, which swift-corelibs-foundation decodes by recursing
    /// until the stack overflows. `path` lists the `$objects` indices around the cycle.
    case referenceCycle(path: [Int])
    /// A Foundation object's coded keys have a shape its `init(coder:)` would crash on.
    case malformedObject(at: String, reason: String)
    /// A decoded object is not of a class the decoding call asked for (SC-3).
    case unexpectedClass(key: String, found: String, expected: [String])
    /// Foundation's unarchiver reported an error (its `CocoaError` code and debug description).
    case decodingFailed(code: Int, reason: String)
    /// An object in the graph cannot be archived (SC-1, KL-2, KL-4): `className` and why.
    case cannotEncode(className: String, reason: String)
    /// The archive just written could not be read back by ``KeyedArchive/unarchivedObject(ofClasses:from:classNames:limits:)``.
    case unreadableArchive(underlying: String)
    /// A class-name map gives one class two names.
    case ambiguousClassName(className: String, names: [String])

    public var description: String {
        switch self {
        case .tooLarge(let size, let limit):
            return "archive of \(size) bytes is larger than the limit of \(limit) bytes"
        case .notAPropertyList(let reason): return "not a property list: \(reason)"
        case .unsupportedFormat(let format):
            return "property list format \(format) is not used for keyed archives"
        case .notAnArchive(let reason): return "not a keyed archive: \(reason)"
        case .invalidReference(let at, let reason): return "invalid reference at \(at): \(reason)"
        case .invalidClass(let at, let reason): return "invalid class at \(at): \(reason)"
        case .classNotAllowed(let name, let at): return "class '\(name)' at \(at) is not allowed"
        case .unknownClass(let name, let at): return "class '\(name)' at \(at) is not known to this process"
        case .insecureClass(let name, let at, let reason):
            return "class '\(name)' at \(at) cannot be decoded securely: \(reason)"
        case .tooManyObjects(let count, let limit):
            return "archive has \(count) objects; the limit is \(limit)"
        case .tooDeep(let at, let limit): return "objects nest deeper than \(limit) levels at \(at)"
        case .referenceCycle(let path):
            return "reference cycle "
                + path.map { "$objects[\($0)]" }.joined(separator: " → ")
                + "; swift-corelibs-foundation cannot decode cycles"
        case .malformedObject(let at, let reason): return "malformed object at \(at): \(reason)"
        case .unexpectedClass(let key, let found, let expected):
            return "value for key '\(key)' is a \(found), not one of \(expected.joined(separator: ", "))"
        case .decodingFailed(let code, let reason): return "decoding failed (Cocoa error \(code)): \(reason)"
        case .cannotEncode(let className, let reason): return "cannot archive \(className): \(reason)"
        case .unreadableArchive(let underlying):
            return "the archive written cannot be read back: \(underlying)"
        case .ambiguousClassName(let className, let names):
            return "class \(className) has more than one archive name: \(names.joined(separator: ", "))"
        }
    }

    public var errorDescription: String? { description }
}
