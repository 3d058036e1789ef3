import Foundation

/// Keyed archives (NSKeyedArchiver / NSKeyedUnarchiver) that are safe to read from untrusted sources on
/// Linux.
///
/// swift-corelibs-foundation calls `fatalError` where Apple's Foundation reports an error: on a class
/// outside the allowed set, a class without secure coding (KL-2), a reference cycle, or objects nested
/// deeply enough to overflow the stack. `KeyedArchive` checks the archive's structure and every class it
/// names first (KA-1..KA-4, docs/library/apple-behaviours.md), throws ``ArchiveError`` for anything
/// that would crash, and only then hands the data to `NSKeyedUnarchiver`.
///
/// Class names on Linux (KL-4): a Swift class archives as `"Module.Class"`, so an archive written by
/// one module does not decode in another. Pin a stable name with `classNames`, on both sides. For
/// reading, Foundation's global `NSKeyedUnarchiver.setClass(_:forClassName:)` is honoured too;
/// `NSKeyedArchiver.setClassName(_:for:)` has no effect on Linux (it files the name under the wrong
/// key). Nested and generic classes cannot be archived at all on Linux.
public enum KeyedArchive {
    /// The `$top` key under which `archivedData(withRootObject:…)` stores the root (KA-2).
    public static let rootObjectKey = NSKeyedArchiveRootObjectKey

    /// Bounds on what an archive may contain.
    public struct Limits: Sendable, Equatable {
        /// Largest archive in bytes.
        public var maximumSize: Int
        /// Most entries in `$objects`.
        public var maximumObjectCount: Int
        /// Deepest chain of objects referring to objects. Foundation on Linux decodes and encodes
        /// recursively, one set of stack frames per level: on a 512 KiB thread stack, 300 levels
        /// decode and 500 overflow.
        public var maximumDepth: Int

        public init(maximumSize: Int = 64 << 20, maximumObjectCount: Int = 1 << 20, maximumDepth: Int = 128) {
            self.maximumSize = maximumSize
            self.maximumObjectCount = maximumObjectCount
            self.maximumDepth = maximumDepth
        }

        public static let `default` = Limits()
    }

    /// Foundation classes every archive may contain, in addition to the caller's classes. Their
    /// `init(coder:)` on Linux has been checked against hostile input (NSDictionary's is made safe by
    /// rewriting the archive first). NSValue is not here: it decodes an Objective-C type string and
    /// calls `fatalError` on one it does not know.
    public static var defaultAllowedClasses: [AnyClass] {
        [
            NSArray.self, NSMutableArray.self, NSDictionary.self, NSMutableDictionary.self,
            NSSet.self, NSMutableSet.self, NSOrderedSet.self, NSMutableOrderedSet.self,
            NSString.self, NSMutableString.self, NSNumber.self, NSDate.self, NSData.self,
            NSMutableData.self, NSURL.self, NSUUID.self, NSNull.self,
        ]
    }

    /// The names corelibs writes for ``defaultAllowedClasses`` (bare, without "Foundation.").
    public static let defaultAllowedClassNames: Set<String> = [
        "NSArray", "NSMutableArray", "NSDictionary", "NSMutableDictionary", "NSSet", "NSMutableSet",
        "NSOrderedSet", "NSMutableOrderedSet", "NSString", "NSMutableString", "NSNumber", "NSDate",
        "NSData", "NSMutableData", "NSURL", "NSUUID", "NSNull",
    ]

    // MARK: Validating

    /// Throws unless `data` is a well-formed keyed archive, within `limits`, whose every class resolves
    /// (through `classNames`, then `NSKeyedUnarchiver`'s global map, then `NSClassFromString`) to a
    /// kind of one of `allowedClasses` or ``defaultAllowedClasses`` that supports secure coding.
    public static func validate(
        _ data: Data, allowedClasses: [AnyClass], classNames: [String: AnyClass] = [:],
        limits: Limits = .default
    ) throws {
        _ = try ArchiveValidator(
            policy: .classes(allowed: allowedClasses + defaultAllowedClasses, map: classNames), limits: limits
        ).validate(data)
    }

    /// Throws unless `data` is a well-formed keyed archive, within `limits`, whose every `$classname` is
    /// in `allowedClassNames` or ``defaultAllowedClassNames``. Names are compared exactly and nothing is
    /// looked up, so this also checks archives for classes this process does not have.
    public static func validate(_ data: Data, allowedClassNames: Set<String>, limits: Limits = .default)
        throws
    {
        _ = try ArchiveValidator(
            policy: .names(allowedClassNames.union(defaultAllowedClassNames)), limits: limits
        )
        .validate(data)
    }

    // MARK: Decoding

    /// Validates `data`, then decodes its root with secure coding (SC-2). Every object must be a kind
    /// of one of `classes` or ``defaultAllowedClasses``, and the root a kind of one of `classes`.
    /// Inside an `init(coder:)`, `decodeObject(of:forKey:)` returns nil for an object of another
    /// allowed class (Apple fails the coder with an error instead, SC-3). Returns nil for a nil root.
    public static func unarchivedObject(
        ofClasses classes: [AnyClass], from data: Data, classNames: [String: AnyClass] = [:],
        limits: Limits = .default
    ) throws -> Any? {
        let permitted = classes + defaultAllowedClasses
        let validated = try ArchiveValidator(
            policy: .classes(allowed: permitted, map: classNames), limits: limits
        )
        .validate(data)
        let unarchiver: NSKeyedUnarchiver
        do {
            unarchiver = try NSKeyedUnarchiver(forReadingFrom: validated.data)
        } catch {
            throw ArchiveError(decoding: error)
        }
        // Before any decoding: corelibs' init(forReadingFrom:) leaves the policy at .raiseException,
        // which turns every decoding error into fatalError.
        unarchiver.requiresSecureCoding = true
        unarchiver.decodingFailurePolicy = .setErrorAndReturn
        let delegate = ClassTokenDelegate(classesByToken: validated.classesByToken)
        unarchiver.delegate = delegate
        let root = withExtendedLifetime(delegate) {
            unarchiver.decodeObject(of: permitted, forKey: rootObjectKey)
        }
        unarchiver.finishDecoding()
        if let error = unarchiver.error { throw ArchiveError(decoding: error) }
        guard let root else { return nil }
        let found: AnyClass = type(of: root as AnyObject)
        guard classes.contains(where: { ArchiveValidator.isKind(found, of: $0) }) else {
            throw ArchiveError.unexpectedClass(
                key: rootObjectKey, found: String(reflecting: found),
                expected: classes.map { String(reflecting: $0) })
        }
        return root
    }

    /// Validates `data`, then decodes a root of class `cls` with secure coding.
    public static func unarchivedObject<DecodedObjectType: NSObject & NSCoding>(
        ofClass cls: DecodedObjectType.Type, from data: Data, classNames: [String: AnyClass] = [:],
        limits: Limits = .default
    ) throws -> DecodedObjectType? {
        guard
            let root = try unarchivedObject(
                ofClasses: [cls], from: data, classNames: classNames, limits: limits)
        else { return nil }
        // The unarchiver already checked the root's class; this cast cannot fail for a kind of `cls`.
        guard let typed = root as? DecodedObjectType else {
            throw ArchiveError.unexpectedClass(
                key: rootObjectKey, found: String(reflecting: type(of: root)),
                expected: [String(reflecting: cls)])
        }
        return typed
    }

    // MARK: Encoding

    /// Archives the graph at `object` the way `NSKeyedArchiver.archivedData(withRootObject:requiringSecureCoding:)`
    /// does, but throws where corelibs would call `fatalError` (SC-1, KL-2, KL-4): an object without
    /// `NSCoding`, without secure coding when `requiringSecureCoding`, a nested or generic class, a
    /// Swift value that does not bridge, or objects nested deeper than `limits.maximumDepth`. The result
    /// is then checked as ``validate(_:allowedClassNames:limits:)`` would, so a graph with a cycle
    /// (which corelibs encodes but cannot decode) throws here rather than on reading.
    ///
    /// - Parameters:
    ///   - object: the root of the graph, stored under `$top["root"]`.
    ///   - requiringSecureCoding: whether every object must adopt `NSSecureCoding`.
    ///   - format: `.binary` (Apple's default) or `.xml` (KA-1).
    ///   - classNames: archive names for classes, e.g. `["MyWhatsit": MyWhatsit.self]` (KL-4).
    ///   - limits: the depth and size bounds the result is checked against.
    public static func archivedData(
        withRootObject object: Any, requiringSecureCoding: Bool,
        format: PropertyListSerialization.PropertyListFormat = .binary, classNames: [String: AnyClass] = [:],
        limits: Limits = .default
    ) throws -> Data {
        guard format == .binary || format == .xml else {
            // NSKeyedArchiver.outputFormat's setter calls fatalError for any other format.
            throw ArchiveError.unsupportedFormat(String(describing: format))
        }
        var namesByClass: [ObjectIdentifier: (cls: AnyClass, names: [String])] = [:]
        for (name, cls): (String, AnyClass) in classNames {
            namesByClass[ObjectIdentifier(cls), default: (cls, [])].names.append(name)
        }
        for entry in namesByClass.values where entry.names.count > 1 {
            throw ArchiveError.ambiguousClassName(
                className: String(reflecting: entry.cls), names: entry.names.sorted())
        }

        try preflight(object, depth: 0, limit: limits.maximumDepth)

        let archiver = NSKeyedArchiver(requiringSecureCoding: requiringSecureCoding)
        archiver.outputFormat = format
        let guardian = ArchivingGuard(maximumDepth: limits.maximumDepth)
        archiver.delegate = guardian
        withExtendedLifetime(guardian) {
            archiver.encode(object, forKey: rootObjectKey)
        }
        var data = archiver.encodedData
        if let failure = guardian.failure { throw failure }
        if let error = archiver.error {
            throw ArchiveError.cannotEncode(className: "the graph", reason: "\(error)")
        }
        if !namesByClass.isEmpty {
            data = try pinClassNames(
                in: data, format: format, names: namesByClass.values.map { ($0.cls, $0.names[0]) })
        }
        do {
            _ = try ArchiveValidator(policy: .unchecked, limits: limits).validate(data)
        } catch let error as ArchiveError {
            throw ArchiveError.unreadableArchive(underlying: error.description)
        }
        return data
    }
}

extension KeyedArchive {
    /// Refuses, before the archiver sees them, objects corelibs crashes on as soon as it hashes them
    /// (which it does first, to look up whether it has encoded them already): NSError (an
    /// unimplemented method) and NSDecimalNumber (unbounded recursion). Only the root and the
    /// collections reachable from it can be looked into; inside an `encode(with:)` they cannot.
    fileprivate static func preflight(_ object: Any, depth: Int, limit: Int) throws {
        if object is NSError || object is NSDecimalNumber {
            throw ArchiveError.cannotEncode(
                className: String(reflecting: type(of: object)),
                reason: "swift-corelibs-foundation crashes encoding this class")
        }
        guard depth < limit else { return }
        if let array = object as? [Any] {
            for element in array { try preflight(element, depth: depth + 1, limit: limit) }
        } else if let dictionary = object as? [AnyHashable: Any] {
            for (key, value) in dictionary {
                try preflight(key.base, depth: depth + 1, limit: limit)
                try preflight(value, depth: depth + 1, limit: limit)
            }
        } else if let set = object as? NSSet {
            for element in set { try preflight(element, depth: depth + 1, limit: limit) }
        } else if let set = object as? NSOrderedSet {
            for element in set { try preflight(element, depth: depth + 1, limit: limit) }
        }
    }

    /// Gives classes their archive names. corelibs' `setClassName(_:for:)` files a name under
    /// `String(describing: type(of: cls))` ("Thing.Type") but looks it up under
    /// `String(reflecting: cls)` ("Module.Thing"), so on Linux it never takes effect; the class
    /// dictionaries are renamed here instead, written as Apple writes a mapped name: `$classname` only.
    fileprivate static func pinClassNames(
        in data: Data, format: PropertyListSerialization.PropertyListFormat, names: [(AnyClass, String)]
    ) throws -> Data {
        var renames: [String: String] = [:]
        for (cls, name): (AnyClass, String) in names { renames[String(reflecting: cls)] = name }
        do {
            guard
                var archive = try PropertyListSerialization.propertyList(from: data, format: nil)
                    as? [String: Any],
                var objects = archive["$objects"] as? [Any]
            else { throw ArchiveError.notAnArchive(reason: "NSKeyedArchiver wrote no archive") }
            for (index, entry) in objects.enumerated() {
                guard var dictionary = entry as? [String: Any],
                    let name = dictionary["$classname"] as? String,
                    let pinned = renames[name]
                else { continue }
                dictionary["$classname"] = pinned
                dictionary.removeValue(forKey: "$classes")
                objects[index] = dictionary
            }
            archive["$objects"] = objects
            return try PropertyListSerialization.data(fromPropertyList: archive, format: format, options: 0)
        } catch let error as ArchiveError {
            throw error
        } catch {
            throw ArchiveError.cannotEncode(className: "the graph", reason: "cannot rename classes: \(error)")
        }
    }
}

extension ArchiveError {
    /// Wraps an error from Foundation's unarchiver, keeping its code and debug description.
    init(decoding error: Error) {
        if let error = error as? ArchiveError {
            self = error
            return
        }
        let ns = error as NSError
        let reason = (ns.userInfo[NSDebugDescriptionErrorKey] as? String) ?? ns.localizedDescription
        self = .decodingFailed(code: ns.code, reason: reason)
    }
}
