import Foundation

/// The structural and class checks behind ``KeyedArchive/validate(_:allowedClasses:classNames:limits:)``.
struct ArchiveValidator {
    enum Policy {
        /// `$classname` must be one of these, compared exactly.
        case names(Set<String>)
        /// `$classname` must resolve to a kind of one of `allowed` that supports secure coding.
        case classes(allowed: [AnyClass], map: [String: AnyClass])
        /// Structure, references, cycles and depth only (for checking what we just wrote).
        case unchecked
    }

    /// A validated archive, ready for `NSKeyedUnarchiver`.
    struct Validated {
        /// The bytes to decode: the input, or (with `.classes`) a rewrite of it in which every
        /// `$classname` is a token no class lookup resolves, so that corelibs asks its delegate.
        var data: Data
        /// The class for each token: what its `$classname` resolved to and was checked as.
        var classesByToken: [String: AnyClass] = [:]
    }

    let policy: Policy
    let limits: KeyedArchive.Limits

    private static let topLevelKeys: Set<String> = ["$archiver", "$version", "$top", "$objects"]

    func validate(_ data: Data) throws -> Validated {
        guard data.count <= limits.maximumSize else {
            throw ArchiveError.tooLarge(size: data.count, limit: limits.maximumSize)
        }
        // CoreFoundation's parsers reject property lists nested deeper than 512 levels and counts that
        // exceed the data, so parsing untrusted bytes is itself safe.
        if Self.binaryPropertyListHasSet(data) {
            throw ArchiveError.notAnArchive(
                reason: "the property list holds a set, which keyed archives never do")
        }
        var format = PropertyListSerialization.PropertyListFormat.binary
        let plist: Any
        do {
            plist = try PropertyListSerialization.propertyList(from: data, options: [], format: &format)
        } catch {
            let ns = error as NSError
            throw ArchiveError.notAPropertyList(
                reason: (ns.userInfo[NSDebugDescriptionErrorKey] as? String) ?? ns.localizedDescription)
        }
        guard format == .binary || format == .xml else { throw ArchiveError.unsupportedFormat("OpenStep") }

        guard var archive = plist as? [String: Any] else {
            throw ArchiveError.notAnArchive(
                reason: "the property list is \(Self.kind(plist)), not a dictionary")
        }
        for key in archive.keys.sorted() where !Self.topLevelKeys.contains(key) {
            throw ArchiveError.notAnArchive(reason: "unexpected top-level key \(key.debugDescription)")
        }
        guard let archiver = archive["$archiver"] else {
            throw ArchiveError.notAnArchive(reason: "$archiver is missing")
        }
        guard archiver as? String == "NSKeyedArchiver" else {
            throw ArchiveError.notAnArchive(
                reason: "$archiver is \(Self.kind(archiver)), not \"NSKeyedArchiver\"")
        }
        guard let version = archive["$version"] else {
            throw ArchiveError.notAnArchive(reason: "$version is missing")
        }
        guard Self.uid(version) == nil, version as? Int == 100_000 else {
            throw ArchiveError.notAnArchive(reason: "$version is \(Self.kind(version)), not 100000")
        }
        guard let topValue = archive["$top"] else {
            throw ArchiveError.notAnArchive(reason: "$top is missing")
        }
        guard let top = topValue as? [String: Any] else {
            throw ArchiveError.notAnArchive(reason: "$top is \(Self.kind(topValue)), not a dictionary")
        }
        guard let objectsValue = archive["$objects"] else {
            throw ArchiveError.notAnArchive(reason: "$objects is missing")
        }
        guard var objects = objectsValue as? [Any] else {
            throw ArchiveError.notAnArchive(reason: "$objects is \(Self.kind(objectsValue)), not an array")
        }
        guard objects.count <= limits.maximumObjectCount else {
            throw ArchiveError.tooManyObjects(count: objects.count, limit: limits.maximumObjectCount)
        }
        guard let first = objects.first, first as? String == "$null" else {
            throw ArchiveError.notAnArchive(reason: "$objects[0] is not \"$null\"")
        }

        // Pass 1: what each entry is, and every reference an object makes (KA-3, KA-4).
        let count = objects.count
        var classNameAt = [String?](repeating: nil, count: count)
        var classOf = [Int](repeating: -1, count: count)  // object index → class-dictionary index
        var references = [[Int]](repeating: [], count: count)
        var referencedFrom = [String?](repeating: nil, count: count)
        for index in 1..<count {
            let entry = objects[index]
            let at = "$objects[\(index)]"
            if Self.uid(entry) != nil {
                throw ArchiveError.invalidReference(at: at, reason: "a UID cannot be an object")
            }
            if let dictionary = entry as? [String: Any] {
                if let classValue = dictionary["$class"] {
                    guard let classIndex = Self.uid(classValue) else {
                        throw ArchiveError.invalidClass(
                            at: at, reason: "$class is \(Self.kind(classValue)), not a UID")
                    }
                    guard classIndex < count else {
                        throw ArchiveError.invalidReference(
                            at: "\(at)[\"$class\"]",
                            reason: "UID \(classIndex) out of range (\(count) objects)")
                    }
                    classOf[index] = Int(classIndex)
                    var refs: [Int] = []
                    for (key, value) in dictionary where key != "$class" {
                        try Self.collectReferences(
                            in: value, at: "\(at)[\(key.debugDescription)]", count: count, into: &refs,
                            origins: &referencedFrom)
                    }
                    references[index] = refs
                } else if let nameValue = dictionary["$classname"] {
                    try Self.checkClassDictionary(dictionary, name: nameValue, at: at)
                    classNameAt[index] = nameValue as? String
                } else {
                    throw ArchiveError.invalidClass(
                        at: at, reason: "a dictionary with neither $class nor $classname")
                }
            } else if entry is [Any] {
                throw ArchiveError.malformedObject(at: at, reason: "an array is not an archived object")
            }
        }

        // Every $class names a class dictionary; no reference names one.
        for index in 1..<count where classOf[index] >= 0 {
            let target = classOf[index]
            guard classNameAt[target] != nil else {
                throw ArchiveError.invalidClass(
                    at: "$objects[\(index)]",
                    reason:
                        "$class refers to $objects[\(target)], which is \(Self.kind(objects[target])), not a class dictionary"
                )
            }
        }
        var roots: [Int] = []
        for key in top.keys.sorted() {
            let at = "$top[\(key.debugDescription)]"
            guard let value = top[key], let ref = Self.uid(value) else {
                throw ArchiveError.invalidReference(at: at, reason: "not a UID")
            }
            guard ref < count else {
                throw ArchiveError.invalidReference(
                    at: at, reason: "UID \(ref) out of range (\(count) objects)")
            }
            roots.append(Int(ref))
            if referencedFrom[Int(ref)] == nil { referencedFrom[Int(ref)] = at }
        }
        for index in 1..<count where classNameAt[index] != nil {
            if let from = referencedFrom[index] {
                throw ArchiveError.invalidReference(
                    at: from, reason: "UID \(index) refers to a class dictionary, not an object")
            }
        }

        // Pass 2: classes, and the shapes of Foundation objects whose init(coder:) trusts the archive.
        var resolved: [Int: AnyClass] = [:]
        var dictionaries: [Int] = []
        var mutableDictionaryClasses: Set<Int> = []
        var orderedSets: [Int] = []
        var mutableOrderedSetClasses: Set<Int> = []
        for index in 1..<count where classOf[index] >= 0 {
            let classIndex = classOf[index]
            guard let name = classNameAt[classIndex] else { continue }
            let at = "$objects[\(index)]"
            let kind: FoundationKind
            switch policy {
            case .unchecked:
                kind = FoundationKind(name: name)
            case .names(let allowed):
                guard allowed.contains(name) else { throw ArchiveError.classNotAllowed(name, at: at) }
                kind = FoundationKind(name: name)
            case .classes(let allowed, let map):
                let cls: AnyClass
                if let known = resolved[classIndex] {
                    cls = known
                } else {
                    cls = try Self.resolve(name, at: at, allowed: allowed, map: map)
                    resolved[classIndex] = cls
                }
                kind = FoundationKind(class: cls)
            }
            guard let dictionary = objects[index] as? [String: Any] else { continue }
            switch kind {
            case .dictionary(let mutable):
                try Self.checkDictionaryShape(dictionary, at: at)
                dictionaries.append(index)
                if mutable { mutableDictionaryClasses.insert(classIndex) }
            case .orderedSet(let mutable):
                // NSOrderedSet's init(coder:) force-casts each NS.object.n, and a nil one crashes,
                // so ordered sets are decoded by ArchivedOrderedSet.
                if let list = dictionary["NS.objects"], !(list is [Any]) {
                    throw ArchiveError.malformedObject(at: at, reason: "NS.objects is not an array")
                }
                orderedSets.append(index)
                if mutable { mutableOrderedSetClasses.insert(classIndex) }
            case .string:
                // NSString's init(coder:) force-casts NS.string to String.
                guard let string = dictionary["NS.string"], string is String else {
                    throw ArchiveError.malformedObject(at: at, reason: "NS.string is missing or not a string")
                }
            case .other:
                break
            }
        }

        // Pass 3: corelibs decodes recursively and caches an object only after its init(coder:)
        // returns, so a cycle recurses forever and a long chain overflows the stack.
        try checkGraph(roots: roots, references: references, isObject: classOf.map { $0 >= 0 })

        guard case .classes = policy else { return Validated(data: data) }
        var classesByToken: [String: AnyClass] = [:]
        for classIndex in resolved.keys.sorted() {
            guard let cls: AnyClass = resolved[classIndex] else { continue }
            guard var dictionary = objects[classIndex] as? [String: Any] else { continue }
            let token = "docfs:\(classIndex)"
            dictionary["$classname"] = token
            // Hints are looked up by name and checked against the allowed classes, which is fatal.
            dictionary.removeValue(forKey: "$classhints")
            objects[classIndex] = dictionary
            switch FoundationKind(class: cls) {
            case .dictionary:
                classesByToken[token] =
                    mutableDictionaryClasses.contains(classIndex)
                    ? ArchivedMutableDictionary.self : ArchivedDictionary.self
            case .orderedSet:
                classesByToken[token] =
                    mutableOrderedSetClasses.contains(classIndex)
                    ? ArchivedMutableOrderedSet.self : ArchivedOrderedSet.self
            default:
                classesByToken[token] = cls
            }
        }
        for index in dictionaries {
            if let dictionary = objects[index] as? [String: Any] {
                objects[index] = Self.rewriteDictionary(dictionary)
            }
        }
        for index in orderedSets {
            if var dictionary = objects[index] as? [String: Any],
                let list = dictionary.removeValue(forKey: "NS.objects") as? [Any]
            {
                for (i, element) in list.enumerated() { dictionary["NS.object.\(i)"] = element }
                objects[index] = dictionary
            }
        }
        archive["$objects"] = objects
        do {
            let rewritten = try PropertyListSerialization.data(
                fromPropertyList: archive, format: .binary, options: 0)
            return Validated(data: rewritten, classesByToken: classesByToken)
        } catch {
            throw ArchiveError.notAPropertyList(reason: "cannot re-serialize the checked archive: \(error)")
        }
    }

    // MARK: Classes

    private static func checkClassDictionary(_ dictionary: [String: Any], name: Any, at: String) throws {
        guard let name = name as? String else {
            throw ArchiveError.invalidClass(at: at, reason: "$classname is \(kind(name)), not a string")
        }
        guard !name.isEmpty, name.utf8.count <= 1024 else {
            throw ArchiveError.invalidClass(at: at, reason: "$classname is empty or longer than 1024 bytes")
        }
        // Apple and corelibs write $classes (the superclass chain) except for a class given a name with
        // setClassName(_:for:), where corelibs writes $classname alone.
        for key in ["$classes", "$classhints"] {
            guard let value = dictionary[key] else { continue }
            guard let names = value as? [Any], names.allSatisfy({ $0 is String }) else {
                throw ArchiveError.invalidClass(
                    at: at, reason: "\(key) is \(kind(value)), not an array of strings")
            }
        }
    }

    /// Resolves `name` the way `NSKeyedUnarchiver` does, and checks what it would otherwise `fatalError`
    /// on (`_isClassAllowed`, `_validateClassSupportsSecureCoding`) or crash on later (a class that
    /// is not an NSObject, which NSArray's `init(coder:)` force-casts).
    private static func resolve(_ name: String, at: String, allowed: [AnyClass], map: [String: AnyClass])
        throws
        -> AnyClass
    {
        guard let cls = map[name] ?? NSKeyedUnarchiver.class(forClassName: name) ?? lookUp(name) else {
            throw ArchiveError.unknownClass(name, at: at)
        }
        guard allowed.contains(where: { isKind(cls, of: $0) }) else {
            throw ArchiveError.classNotAllowed(name, at: at)
        }
        guard let objectClass = cls as? NSObject.Type else {
            throw ArchiveError.insecureClass(name, at: at, reason: "it is not a subclass of NSObject")
        }
        let constructed: AnyClass = objectClass.classForKeyedUnarchiver()
        guard constructed is NSObject.Type, constructed is NSCoding.Type else {
            throw ArchiveError.insecureClass(
                name, at: at, reason: "\(String(reflecting: constructed)) does not adopt NSCoding")
        }
        guard let secure = constructed as? NSSecureCoding.Type, secure.supportsSecureCoding else {
            throw ArchiveError.insecureClass(
                name, at: at, reason: "\(String(reflecting: constructed)) does not support NSSecureCoding")
        }
        return cls
    }

    /// `NSClassFromString`, for names that can be a top-level class ("Class" or "Module.Class").
    /// Anything else would only make corelibs log and return nil.
    private static func lookUp(_ name: String) -> AnyClass? {
        let parts = name.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count <= 2, !name.hasPrefix("_Tt") else { return nil }
        for part in parts {
            guard let head = part.unicodeScalars.first, head == "_" || head.properties.isAlphabetic,
                part.unicodeScalars.allSatisfy({
                    $0 == "_" || $0.properties.isAlphabetic || $0.properties.numericType != nil
                })
            else { return nil }
        }
        return NSClassFromString(name)
    }

    static func isKind(_ cls: AnyClass, of ancestor: AnyClass) -> Bool {
        var current: AnyClass? = cls
        while let candidate = current {
            if candidate == ancestor { return true }
            current = _getSuperclass(candidate)
        }
        return false
    }

    // MARK: Foundation shapes

    /// Foundation classes whose `init(coder:)` on Linux trusts the archive's shape.
    private enum FoundationKind {
        case dictionary(mutable: Bool)
        case orderedSet(mutable: Bool)
        case string, other

        init(name: String) {
            switch name {
            case "NSDictionary": self = .dictionary(mutable: false)
            case "NSMutableDictionary": self = .dictionary(mutable: true)
            case "NSString", "NSMutableString": self = .string
            case "NSOrderedSet": self = .orderedSet(mutable: false)
            case "NSMutableOrderedSet": self = .orderedSet(mutable: true)
            default: self = .other
            }
        }

        init(class cls: AnyClass) {
            let constructed: AnyClass = (cls as? NSObject.Type)?.classForKeyedUnarchiver() ?? cls
            if ArchiveValidator.isKind(constructed, of: NSDictionary.self) {
                self = .dictionary(
                    mutable: ArchiveValidator.isKind(constructed, of: NSMutableDictionary.self))
            } else if ArchiveValidator.isKind(constructed, of: NSString.self) {
                self = .string
            } else if ArchiveValidator.isKind(constructed, of: NSOrderedSet.self) {
                self = .orderedSet(
                    mutable: ArchiveValidator.isKind(constructed, of: NSMutableOrderedSet.self))
            } else {
                self = .other
            }
        }
    }

    /// NSDictionary's `init(coder:)` reads `NS.objects` into a buffer sized by `NS.keys`' count; if
    /// fewer objects decode than keys (a nil, a non-UID, any failure), it reads past the buffer. So
    /// dictionaries are decoded by ``ArchivedDictionary`` instead, from this checked shape.
    private static func checkDictionaryShape(_ dictionary: [String: Any], at: String) throws {
        let keys = dictionary["NS.keys"]
        let objects = dictionary["NS.objects"]
        if keys == nil && objects == nil { return }
        guard let keys = keys as? [Any], let objects = objects as? [Any] else {
            throw ArchiveError.malformedObject(at: at, reason: "NS.keys and NS.objects must both be arrays")
        }
        guard keys.count == objects.count else {
            throw ArchiveError.malformedObject(
                at: at, reason: "\(keys.count) keys but \(objects.count) objects")
        }
        for (name, list) in [("NS.keys", keys), ("NS.objects", objects)] {
            for (i, element) in list.enumerated() {
                guard let ref = uid(element), ref != 0 else {
                    throw ArchiveError.malformedObject(
                        at: "\(at)[\"\(name)\"][\(i)]", reason: "not a non-nil UID")
                }
            }
        }
    }

    /// Moves `NS.keys`/`NS.objects` to `NS.key.n`/`NS.object.n`, which ``ArchivedDictionary`` reads
    /// pair by pair, so no count can disagree.
    private static func rewriteDictionary(_ dictionary: [String: Any]) -> [String: Any] {
        var result = dictionary
        let keys = (result.removeValue(forKey: "NS.keys") as? [Any]) ?? []
        let objects = (result.removeValue(forKey: "NS.objects") as? [Any]) ?? []
        for (i, pair) in zip(keys, objects).enumerated() {
            result["NS.key.\(i)"] = pair.0
            result["NS.object.\(i)"] = pair.1
        }
        return result
    }

    // MARK: References and graph

    private static func collectReferences(
        in value: Any, at: String, count: Int, into refs: inout [Int], origins: inout [String?]
    ) throws {
        if let ref = uid(value) {
            guard ref < count else {
                throw ArchiveError.invalidReference(
                    at: at, reason: "UID \(ref) out of range (\(count) objects)")
            }
            refs.append(Int(ref))
            if origins[Int(ref)] == nil { origins[Int(ref)] = at }
        } else if let array = value as? [Any] {
            // Property lists nest at most 512 deep (CoreFoundation's limit), so this recursion is bounded.
            for (i, element) in array.enumerated() {
                try collectReferences(
                    in: element, at: "\(at)[\(i)]", count: count, into: &refs, origins: &origins)
            }
        } else if let dictionary = value as? [String: Any] {
            for (key, element) in dictionary {
                try collectReferences(
                    in: element, at: "\(at)[\(key.debugDescription)]", count: count, into: &refs,
                    origins: &origins)
            }
        }
    }

    /// Rejects cycles and chains longer than `limits.maximumDepth`, iteratively (the input is untrusted).
    private func checkGraph(roots: [Int], references: [[Int]], isObject: [Bool]) throws {
        let count = references.count
        var state = [UInt8](repeating: 0, count: count)  // 0 unvisited, 1 on the path, 2 done
        var height = [Int](repeating: 0, count: count)
        var path: [(node: Int, next: Int)] = []
        for start in roots + Array(0..<count) where isObject[start] && state[start] == 0 {
            state[start] = 1
            path.append((start, 0))
            while let last = path.last {
                let edges = references[last.node]
                if last.next < edges.count {
                    path[path.count - 1].next += 1
                    let child = edges[last.next]
                    guard isObject[child] else { continue }
                    switch state[child] {
                    case 1:
                        let loop = path.map(\.node).drop(while: { $0 != child })
                        throw ArchiveError.referenceCycle(path: Array(loop) + [child])
                    case 2:
                        continue
                    default:
                        state[child] = 1
                        path.append((child, 0))
                        if path.count > limits.maximumDepth {
                            throw ArchiveError.tooDeep(at: "$objects[\(child)]", limit: limits.maximumDepth)
                        }
                    }
                } else {
                    var deepest = 0
                    for child in edges where isObject[child] { deepest = max(deepest, height[child]) }
                    height[last.node] = deepest + 1
                    if deepest + 1 > limits.maximumDepth {
                        throw ArchiveError.tooDeep(at: "$objects[\(last.node)]", limit: limits.maximumDepth)
                    }
                    state[last.node] = 2
                    path.removeLast()
                }
            }
        }
    }

    // MARK: Property-list values

    /// The value of a plist UID (`CF$UID`), or nil if `value` is not one. Foundation's UID class is
    /// internal; its only stored value is read through reflection.
    /// Whether `data` is a binary property list with a set object (marker 0xC_) in its object
    /// table. Keyed archives never hold one (NSKeyedArchiver writes sets as arrays), and corelibs
    /// Foundation's parser dereferences a null pointer bridging some (a set of containers), so they
    /// are refused before parsing. A table that does not fit is left to the parser to reject.
    static func binaryPropertyListHasSet(_ data: Data) -> Bool {
        let bytes = [UInt8](data)
        guard bytes.count >= 40, bytes.starts(with: Array("bplist0".utf8)) else { return false }
        func number(_ start: Int, _ width: Int) -> Int? {
            guard start >= 0, width >= 1, width <= 8, start + width <= bytes.count else { return nil }
            let value = bytes[start..<start + width].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
            return value <= UInt64(bytes.count) ? Int(value) : nil
        }
        let trailer = bytes.count - 32
        let offsetSize = Int(bytes[trailer + 6])
        guard (1...8).contains(offsetSize), let count = number(trailer + 8, 8),
            let table = number(trailer + 24, 8),
            table + count * offsetSize <= trailer
        else { return false }
        for index in 0..<count {
            guard let offset = number(table + index * offsetSize, offsetSize), offset < trailer else {
                continue
            }
            if bytes[offset] & 0xF0 == 0xC0 { return true }
        }
        return false
    }

    static func uid(_ value: Any) -> UInt32? {
        guard let object = value as? NSObject, NSStringFromClass(type(of: object)) == "_NSKeyedArchiverUID"
        else {
            return nil
        }
        for child in Mirror(reflecting: object).children where child.label == "value" {
            return child.value as? UInt32
        }
        return nil
    }

    static func kind(_ value: Any) -> String {
        if let ref = uid(value) { return "UID \(ref)" }
        switch value {
        case let string as String: return "the string \(String(string.prefix(64)).debugDescription)"
        case is [String: Any]: return "a dictionary"
        case is [Any]: return "an array"
        case is Data: return "data"
        case is Date: return "a date"
        case let number as NSNumber: return "the number \(number)"
        default: return "a \(type(of: value))"
        }
    }
}
