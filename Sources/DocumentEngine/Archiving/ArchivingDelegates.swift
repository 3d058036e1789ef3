import Foundation

/// The unarchiver's delegate, which supplies every class.
///
/// corelibs checks a class it finds by name against the allowed classes of the innermost
/// `decodeObject(of:forKey:)` and calls `fatalError` on a mismatch (KL-2), so even an allowed class in
/// an unexpected slot would crash. ``ArchiveValidator`` therefore replaces each `$classname` with a
/// token no lookup resolves; corelibs then asks this delegate, which returns the class the validator
/// checked, and uses it without the fatal check. Type checks inside `init(coder:)` are the casts of
/// `decodeObject(of:forKey:)` (a mismatch decodes as nil, not as an error as on Apple's platforms).
final class ClassTokenDelegate: NSObject, NSKeyedUnarchiverDelegate {
    private let classesByToken: [String: AnyClass]

    init(classesByToken: [String: AnyClass]) {
        self.classesByToken = classesByToken
    }

    func unarchiver(
        _ unarchiver: NSKeyedUnarchiver, cannotDecodeObjectOfClassName name: String,
        originalClasses classNames: [String]
    ) -> AnyClass? {
        classesByToken[name]
    }

    func unarchiver(_ unarchiver: NSKeyedUnarchiver, didDecode object: Any?) -> Any? {
        // nil keeps the object; returning it would make corelibs hash every decoded object.
        (object as? ArchivedCollection)?.collection
    }

    func unarchiver(_ unarchiver: NSKeyedUnarchiver, willReplace object: Any, with newObject: Any) {}
    func unarchiverWillFinish(_ unarchiver: NSKeyedUnarchiver) {}
    func unarchiverDidFinish(_ unarchiver: NSKeyedUnarchiver) {}
}

/// A stand-in that decodes a Foundation collection safely and is replaced by it once decoded.
protocol ArchivedCollection: AnyObject {
    var collection: NSObject { get }
}

/// Decodes an NSDictionary from the `NS.key.n`/`NS.object.n` pairs ``ArchiveValidator`` wrote, and
/// is replaced by that dictionary as soon as it is decoded. (Foundation's own `init(coder:)` reads
/// past a buffer when fewer objects than keys decode.)
class ArchivedDictionary: NSObject, NSSecureCoding, ArchivedCollection {
    static var supportsSecureCoding: Bool { true }

    let dictionary: NSDictionary

    required init?(coder: NSCoder) {
        var pairs: [AnyHashable: Any] = [:]
        var index = 0
        while coder.containsValue(forKey: "NS.key.\(index)") {
            if let key = coder.decodeObject(forKey: "NS.key.\(index)") as AnyObject as? NSObject,
                let value = coder.decodeObject(forKey: "NS.object.\(index)")
            {
                pairs[AnyHashable(key)] = value
            }
            index += 1
        }
        dictionary = Self.isMutable ? NSMutableDictionary(dictionary: pairs) : NSDictionary(dictionary: pairs)
    }

    class var isMutable: Bool { false }

    var collection: NSObject { dictionary }

    func encode(with coder: NSCoder) {
        dictionary.encode(with: coder)
    }
}

/// ``ArchivedDictionary`` for NSMutableDictionary.
final class ArchivedMutableDictionary: ArchivedDictionary {
    override class var isMutable: Bool { true }
}

/// Decodes an NSOrderedSet from `NS.object.n`, skipping what does not decode. (Foundation's own
/// `init(coder:)` force-casts each element, so a nil one crashes.)
class ArchivedOrderedSet: NSObject, NSSecureCoding, ArchivedCollection {
    static var supportsSecureCoding: Bool { true }

    let orderedSet: NSOrderedSet

    required init?(coder: NSCoder) {
        var elements: [Any] = []
        var index = 0
        while coder.containsValue(forKey: "NS.object.\(index)") {
            if let element = coder.decodeObject(forKey: "NS.object.\(index)") { elements.append(element) }
            index += 1
        }
        orderedSet = Self.isMutable ? NSMutableOrderedSet(array: elements) : NSOrderedSet(array: elements)
    }

    class var isMutable: Bool { false }

    var collection: NSObject { orderedSet }

    func encode(with coder: NSCoder) {
        orderedSet.encode(with: coder)
    }
}

/// ``ArchivedOrderedSet`` for NSMutableOrderedSet.
final class ArchivedMutableOrderedSet: ArchivedOrderedSet {
    override class var isMutable: Bool { true }
}

/// The archiver's delegate: refuses, before corelibs would `fatalError`, every object it cannot encode.
///
/// Returning nil from `archiver(_:willEncode:)` crashes corelibs (it force-unwraps the replacement of
/// an object it has not seen), so a refused object is replaced by NSNull and the archive discarded.
final class ArchivingGuard: NSObject, NSKeyedArchiverDelegate {
    private let maximumDepth: Int
    private var depth = 0
    private(set) var failure: ArchiveError?

    init(maximumDepth: Int) {
        self.maximumDepth = maximumDepth
    }

    func archiver(_ archiver: NSKeyedArchiver, willEncode object: Any) -> Any? {
        guard failure == nil else { return NSNull() }
        if let (className, reason) = Self.problem(encoding: object, secure: archiver.requiresSecureCoding) {
            failure = .cannotEncode(className: className, reason: reason)
            return NSNull()
        }
        if Self.isContainer(object) {
            depth += 1
            if depth > maximumDepth {
                failure = .cannotEncode(
                    className: String(reflecting: type(of: object)),
                    reason: "objects nest deeper than \(maximumDepth) levels")
                return NSNull()
            }
        }
        return object
    }

    func archiver(_ archiver: NSKeyedArchiver, didEncode object: Any?) {
        // didEncode also follows objects already encoded, which had no willEncode: those are
        // leaves here, and the count only bounds the depth approximately.
        if let object, Self.isContainer(object), depth > 0 { depth -= 1 }
    }

    func archiver(_ archiver: NSKeyedArchiver, willReplace object: Any?, withObject newObject: Any?) {}
    func archiverWillFinish(_ archiver: NSKeyedArchiver) {}
    func archiverDidFinish(_ archiver: NSKeyedArchiver) {}

    /// What corelibs stores inline rather than as an object dictionary (KA-5).
    private static func isContainer(_ object: Any) -> Bool {
        if object is String { return false }
        guard let ns = object as AnyObject as? NSObject else { return true }
        let coder: AnyClass = ns.classForCoder
        return !(coder == NSString.self || coder == NSNumber.self || coder == NSData.self)
    }

    /// Why corelibs would crash encoding `object`, as (class name, reason), or nil if it would not.
    static func problem(encoding object: Any, secure: Bool) -> (String, String)? {
        let stored = object as AnyObject
        let typeName = String(reflecting: type(of: object))
        guard let ns = stored as? NSObject, String(reflecting: type(of: stored)) != "Foundation.__SwiftValue"
        else {
            return (
                typeName,
                "a Swift value that does not bridge to a Foundation class; use an NSCoding class or Codable"
            )
        }
        if secure {
            guard let codable = ns as? NSSecureCoding, type(of: codable).supportsSecureCoding else {
                return (typeName, "it does not support NSSecureCoding, and secure coding is required")
            }
        }
        guard isContainer(object) else { return nil }
        guard ns is NSCoding else { return (typeName, "it does not adopt NSCoding") }
        // NSStringFromClass, which names every class in the chain, calls fatalError unless the
        // class is top-level: "Module.Class" (KL-4).
        var current: AnyClass? = ns.classForKeyedArchiver ?? type(of: ns)
        while let cls = current {
            let name = String(reflecting: cls)
            if name.split(separator: ".", omittingEmptySubsequences: false).count != 2 {
                return (name, "only top-level, non-generic classes can be archived on Linux")
            }
            current = _getSuperclass(cls)
        }
        return nil
    }
}
