import Foundation
import Testing
import TestSupport

@testable import DocumentEngine

#if canImport(Glibc)
    import Glibc
#endif

// The seeds' model classes. On Linux, archived classes must be top-level: NSStringFromClass calls
// fatalError for nested ones (KL-4).

/// MyStuff's MyWhatsit: two strings and an image key, archived with encodeObject:forKey:.
final class MyWhatsit: NSObject, NSSecureCoding {
    static var supportsSecureCoding: Bool { true }
    var name: String?
    var location: String?
    var imageKey: String?

    init(name: String?, location: String?, imageKey: String? = nil) {
        self.name = name
        self.location = location
        self.imageKey = imageKey
    }

    func encode(with coder: NSCoder) {
        coder.encode(name, forKey: "name")
        coder.encode(location, forKey: "location")
        coder.encode(imageKey, forKey: "imageKey")
    }

    init?(coder: NSCoder) {
        name = coder.decodeObject(of: NSString.self, forKey: "name") as String?
        location = coder.decodeObject(of: NSString.self, forKey: "location") as String?
        imageKey = coder.decodeObject(of: NSString.self, forKey: "imageKey") as String?
    }
}

/// Homepwner's BNRItem: strings, a date, and an int encoded with encodeInt:forKey:.
class BNRItem: NSObject, NSSecureCoding {
    class var supportsSecureCoding: Bool { true }
    var itemName: String
    var serialNumber: String
    var valueInDollars: Int32
    var dateCreated: Date
    var imageKey: String?

    init(itemName: String, serialNumber: String, valueInDollars: Int32, dateCreated: Date) {
        self.itemName = itemName
        self.serialNumber = serialNumber
        self.valueInDollars = valueInDollars
        self.dateCreated = dateCreated
    }

    func encode(with coder: NSCoder) {
        coder.encode(itemName, forKey: "itemName")
        coder.encode(serialNumber, forKey: "serialNumber")
        coder.encode(dateCreated, forKey: "dateCreated")
        coder.encode(imageKey, forKey: "imageKey")
        coder.encode(valueInDollars, forKey: "valueInDollars")  // encodeInt:forKey:
    }

    required init?(coder: NSCoder) {
        itemName = coder.decodeObject(of: NSString.self, forKey: "itemName") as String? ?? ""
        serialNumber = coder.decodeObject(of: NSString.self, forKey: "serialNumber") as String? ?? ""
        imageKey = coder.decodeObject(of: NSString.self, forKey: "imageKey") as String?
        valueInDollars = coder.decodeInt32(forKey: "valueInDollars")  // decodeIntForKey:
        dateCreated = coder.decodeObject(of: NSDate.self, forKey: "dateCreated") as Date? ?? .distantPast
    }
}

/// A BNRItem subclass that chains through super.encode(with:) and super.init(coder:).
final class BNRContainer: BNRItem {
    override class var supportsSecureCoding: Bool { true }
    var subitems: [BNRItem] = []

    init(itemName: String, subitems: [BNRItem]) {
        self.subitems = subitems
        super.init(
            itemName: itemName, serialNumber: "C", valueInDollars: 0,
            dateCreated: Date(timeIntervalSince1970: 0))
    }

    override func encode(with coder: NSCoder) {
        super.encode(with: coder)
        coder.encode(subitems, forKey: "subitems")
    }

    required init?(coder: NSCoder) {
        subitems =
            coder.decodeObject(of: [NSArray.self, BNRItem.self], forKey: "subitems") as? [BNRItem] ?? []
        super.init(coder: coder)
    }
}

/// A linked node, for chains and cycles.
final class ArchiveNode: NSObject, NSSecureCoding {
    static var supportsSecureCoding: Bool { true }
    var label: String
    var next: ArchiveNode?

    init(_ label: String) { self.label = label }

    func encode(with coder: NSCoder) {
        coder.encode(label, forKey: "label")
        coder.encode(next, forKey: "next")
    }

    init?(coder: NSCoder) {
        label = coder.decodeObject(of: NSString.self, forKey: "label") as String? ?? ""
        super.init()
        next = coder.decodeObject(of: ArchiveNode.self, forKey: "next")
    }

    static func chain(_ count: Int) -> ArchiveNode {
        let head = ArchiveNode("0")
        var last = head
        for i in 1..<max(count, 1) {
            let node = ArchiveNode("\(i)")
            last.next = node
            last = node
        }
        return head
    }
}

/// NSCoding without NSSecureCoding.
final class PlainThing: NSObject, NSCoding {
    var name = "plain"
    override init() {}
    func encode(with coder: NSCoder) { coder.encode(name, forKey: "name") }
    init?(coder: NSCoder) { name = coder.decodeObject(forKey: "name") as? String ?? "" }
}

/// A secure class that exists but that no test allows.
final class EvilThing: NSObject, NSSecureCoding {
    static var supportsSecureCoding: Bool { true }
    override init() {}
    func encode(with coder: NSCoder) {}
    init?(coder: NSCoder) {}
}

/// The same model as MyWhatsit under another module's name (KL-4).
final class ImportedWhatsit: NSObject, NSSecureCoding {
    static var supportsSecureCoding: Bool { true }
    var name: String?
    func encode(with coder: NSCoder) { coder.encode(name, forKey: "name") }
    init?(coder: NSCoder) { name = coder.decodeObject(of: NSString.self, forKey: "name") as String? }
}

/// Only for the test of the global class-name tables, so no other test sees its mapping.
final class GloballyNamedThing: NSObject, NSSecureCoding {
    static var supportsSecureCoding: Bool { true }
    var value: Int
    init(value: Int) { self.value = value }
    func encode(with coder: NSCoder) { coder.encode(value, forKey: "value") }
    init?(coder: NSCoder) { value = coder.decodeInteger(forKey: "value") }
}

/// A Swift-native model for the Codable path.
struct Thing: Codable, Equatable {
    var name: String
    var value: Int
    var date: Date
    var imageKey: String?
}

enum Outer {
    /// Nested, so corelibs cannot name it.
    final class Nested: NSObject, NSSecureCoding {
        static var supportsSecureCoding: Bool { true }
        override init() {}
        func encode(with coder: NSCoder) {}
        init?(coder: NSCoder) {}
    }
}

// MARK: - Helpers

/// A reference in an XML archive (KA-3).
private func uid(_ n: Int) -> String { "<dict><key>CF$UID</key><integer>\(n)</integer></dict>" }

/// An XML property list from the given body.
private func xmlPlist(_ body: String) -> Data {
    Data(
        """
        <?xml version="1.0" encoding="UTF-8"?>
        <plist version="1.0">\(body)</plist>
        """.utf8)
}

/// An XML keyed archive with `$top = {root: UID root}` and `$objects` = "$null" + `objects`.
private func xmlArchive(
    root: Int = 1, objects: [String], archiver: String = "<string>NSKeyedArchiver</string>",
    version: String = "<integer>100000</integer>"
) -> Data {
    xmlPlist(
        "<dict><key>$archiver</key>\(archiver)<key>$version</key>\(version)"
            + "<key>$top</key><dict><key>root</key>\(uid(root))</dict>"
            + "<key>$objects</key><array><string>$null</string>\(objects.joined())</array></dict>")
}

private func classDictionary(_ name: String, _ chain: [String]? = nil) -> String {
    let classes = (chain ?? [name, "NSObject"]).map { "<string>\($0)</string>" }.joined()
    return
        "<dict><key>$classname</key><string>\(name)</string><key>$classes</key><array>\(classes)</array></dict>"
}

private func plistDictionary(_ data: Data) throws -> [String: Any] {
    try #require(try PropertyListSerialization.propertyList(from: data, format: nil) as? [String: Any])
}

private let whatsitName = String(reflecting: MyWhatsit.self)

private func sampleItem(_ name: String, value: Int32 = 42) -> BNRItem {
    BNRItem(
        itemName: name, serialNumber: "SN-\(name)", valueInDollars: value,
        dateCreated: Date(timeIntervalSinceReferenceDate: 700_000_000.25))
}

private func expectArchiveError(
    _ data: Data, allowing classes: [AnyClass] = [MyWhatsit.self],
    sourceLocation: SourceLocation = #_sourceLocation,
    _ matches: (ArchiveError) -> Bool
) {
    do {
        let object = try KeyedArchive.unarchivedObject(ofClasses: classes, from: data)
        Issue.record(
            "decoded \(String(describing: object)) instead of throwing", sourceLocation: sourceLocation)
    } catch let error as ArchiveError {
        #expect(matches(error), "\(error)", sourceLocation: sourceLocation)
    } catch {
        Issue.record("threw \(error), not an ArchiveError", sourceLocation: sourceLocation)
    }
}

// MARK: - Tests

/// Keyed archiving on Linux: the seeds' NSCoding workflow (KA-1..KA-6, SC-1..SC-4), what
/// swift-corelibs-foundation does (KL-1..KL-5), and untrusted archives that must throw, not crash
/// (the ids: docs/library/apple-behaviours.md).
@Suite struct ArchivingTests {
    // MARK: Seed workflows

    @Test("KA-2, SC-2: MyWhatsit round-trips with encode(_:forKey:) and decodeObject(of:forKey:)")
    func myWhatsitRoundTrip() throws {
        let things = [
            MyWhatsit(name: "Robot", location: "Office", imageKey: "1__#$!@%!#__image.png"),
            MyWhatsit(name: "Lamp", location: nil),
        ]
        let data = try KeyedArchive.archivedData(withRootObject: things, requiringSecureCoding: true)
        let decoded = try #require(
            try KeyedArchive.unarchivedObject(ofClasses: [NSArray.self, MyWhatsit.self], from: data)
                as? [MyWhatsit])
        #expect(decoded.map(\.name) == ["Robot", "Lamp"])
        #expect(decoded.map(\.location) == ["Office", nil])
        #expect(decoded.map(\.imageKey) == ["1__#$!@%!#__image.png", nil])
    }

    @Test("KA-5: BNRItem's typed encodes (int, date, strings) and a subclass chaining through super")
    func bnrItemAndSubclass() throws {
        let container = BNRContainer(
            itemName: "Box", subitems: [sampleItem("Cup", value: -7), sampleItem("Pen")])
        container.valueInDollars = Int32.max
        container.imageKey = "box"
        for format in [PropertyListSerialization.PropertyListFormat.binary, .xml] {
            let data = try KeyedArchive.archivedData(
                withRootObject: container, requiringSecureCoding: true, format: format)
            // The subitems are BNRItems, so BNRItem must be allowed; the root is still a container.
            let decoded = try #require(
                try KeyedArchive.unarchivedObject(ofClasses: [BNRItem.self], from: data) as? BNRContainer)
            // Superclass properties came back through super.init(coder:).
            #expect(
                decoded.itemName == "Box" && decoded.valueInDollars == Int32.max && decoded.imageKey == "box")
            #expect(decoded.dateCreated == Date(timeIntervalSince1970: 0))
            #expect(decoded.subitems.map(\.itemName) == ["Cup", "Pen"])
            #expect(decoded.subitems.map(\.valueInDollars) == [-7, 42])
            #expect(decoded.subitems.map(\.serialNumber) == ["SN-Cup", "SN-Pen"])
            #expect(decoded.subitems[0].dateCreated == Date(timeIntervalSinceReferenceDate: 700_000_000.25))
        }
    }

    @Test("KA-6: a shared object is encoded once and decodes to one instance")
    func sharedReferences() throws {
        let shared = sampleItem("Shared")
        let first = BNRContainer(itemName: "A", subitems: [shared])
        let second = BNRContainer(itemName: "B", subitems: [shared, sampleItem("Own")])
        let data = try KeyedArchive.archivedData(
            withRootObject: [first, second], requiringSecureCoding: true)

        let objects = try #require(try plistDictionary(data)["$objects"] as? [Any])
        let sharedCopies = objects.filter { ($0 as? String) == "Shared" }
        #expect(sharedCopies.count == 1)

        let decoded = try #require(
            try KeyedArchive.unarchivedObject(ofClasses: [NSArray.self, BNRItem.self], from: data)
                as? [BNRContainer])
        #expect(decoded.count == 2)
        #expect(decoded[0].subitems[0] === decoded[1].subitems[0])
        #expect(decoded[1].subitems[1] !== decoded[0].subitems[0])
    }

    @Test("KL-2: a cycle encodes but corelibs cannot decode it, so both directions throw")
    func cycles() throws {
        let a = ArchiveNode("a")
        let b = ArchiveNode("b")
        a.next = b
        b.next = a
        #expect {
            try KeyedArchive.archivedData(withRootObject: a, requiringSecureCoding: true)
        } throws: { error in
            guard case .unreadableArchive(let reason) = error as? ArchiveError else { return false }
            return reason.contains("reference cycle")
        }
        // Foundation's own archiver writes it; reading it must throw, not recurse until the stack ends.
        let raw = try NSKeyedArchiver.archivedData(withRootObject: a, requiringSecureCoding: true)
        expectArchiveError(raw, allowing: [ArchiveNode.self]) {
            if case .referenceCycle(let path) = $0 { return path.count == 3 && path.first == path.last }
            return false
        }
    }

    @Test("Limits: chains deeper than maximumDepth throw on encode and decode; shallower ones work")
    func depthLimits() throws {
        let limits = KeyedArchive.Limits(maximumDepth: 50)
        let ok = try KeyedArchive.archivedData(
            withRootObject: ArchiveNode.chain(50), requiringSecureCoding: true, limits: limits)
        let decoded = try #require(
            try KeyedArchive.unarchivedObject(ofClass: ArchiveNode.self, from: ok, limits: limits))
        var count = 0
        var node: ArchiveNode? = decoded
        while let current = node {
            count += 1
            node = current.next
        }
        #expect(count == 50)
        #expect(throws: ArchiveError.self) {
            try KeyedArchive.archivedData(
                withRootObject: ArchiveNode.chain(51), requiringSecureCoding: true, limits: limits)
        }
        let deep = try NSKeyedArchiver.archivedData(
            withRootObject: ArchiveNode.chain(200), requiringSecureCoding: true)
        expectArchiveError(deep, allowing: [ArchiveNode.self]) {
            if case .tooDeep(_, let limit) = $0 { return limit == KeyedArchive.Limits.default.maximumDepth }
            return false
        }
    }

    // MARK: Format (KA-1..KA-5)

    @Test("KA-1..KA-5: the structure of a real archive, binary by default and XML on request")
    func archiveStructure() throws {
        let container = BNRContainer(itemName: "Box", subitems: [sampleItem("Cup"), sampleItem("Pen")])
        let binary = try KeyedArchive.archivedData(withRootObject: container, requiringSecureCoding: true)
        #expect(binary.starts(with: Data("bplist00".utf8)))
        let xml = try KeyedArchive.archivedData(
            withRootObject: container, requiringSecureCoding: true, format: .xml)
        #expect(String(decoding: xml, as: UTF8.self).contains("<key>CF$UID</key>"))  // KA-3

        for data in [binary, xml] {
            let archive = try plistDictionary(data)
            #expect(Set(archive.keys) == ["$archiver", "$version", "$top", "$objects"])
            #expect(archive["$archiver"] as? String == "NSKeyedArchiver")
            #expect(archive["$version"] as? Int == 100_000)
            let top = try #require(archive["$top"] as? [String: Any])
            #expect(Array(top.keys) == [KeyedArchive.rootObjectKey])
            let objects = try #require(archive["$objects"] as? [Any])
            #expect(objects.first as? String == "$null")

            func index(_ value: Any?) throws -> Int {
                try #require(value.flatMap(ArchiveValidator.uid).map(Int.init))
            }
            let rootIndex = try index(top["root"])
            let root = try #require(objects[rootIndex] as? [String: Any])
            let rootClass = try #require(objects[try index(root["$class"])] as? [String: Any])
            #expect(rootClass["$classname"] as? String == "DocumentEngineTests.BNRContainer")  // KL-4
            #expect(
                rootClass["$classes"] as? [String] == [
                    "DocumentEngineTests.BNRContainer", "DocumentEngineTests.BNRItem", "NSObject",
                ])
            // KA-5: the int is inline; the date is an NSDate object with NS.time.
            #expect(root["valueInDollars"] as? Int == 0)
            let date = try #require(objects[try index(root["dateCreated"])] as? [String: Any])
            #expect(date["NS.time"] as? Double == 0 - Date.timeIntervalBetween1970AndReferenceDate)

            // KA-4: one class dictionary per class, shared by both items.
            let classNames = objects.compactMap { ($0 as? [String: Any])?["$classname"] as? String }
            #expect(
                classNames.sorted() == [
                    "DocumentEngineTests.BNRContainer", "DocumentEngineTests.BNRItem", "NSArray", "NSDate",
                ])
            try KeyedArchive.validate(data, allowedClasses: [BNRItem.self])
            try KeyedArchive.validate(
                data, allowedClassNames: ["DocumentEngineTests.BNRContainer", "DocumentEngineTests.BNRItem"])
        }
    }

    @Test("KA-5, KL-1: the names corelibs writes for Foundation classes, and that the defaults round-trip")
    func foundationClassNames() throws {
        let values: [(Any, String?)] = [
            (NSArray(array: [1]), "NSArray"), (NSMutableArray(array: [1]), "NSMutableArray"),
            (["k": 1] as [String: Int], "NSDictionary"),
            (NSMutableDictionary(dictionary: ["k": 1]), "NSMutableDictionary"),
            (Set([1]), "NSSet"), (NSMutableSet(array: [1]), "NSMutableSet"),
            (NSOrderedSet(array: [1, 2]), "NSOrderedSet"),
            (Date(timeIntervalSince1970: 5), "NSDate"), (URL(string: "https://example.com/a")!, "NSURL"),
            (UUID(), "NSUUID"), (NSNull(), "NSNull"), (NSMutableData(data: Data([1])), "NSMutableData"),
            // Stored inline as plist values, with no class dictionary (KA-5) — NSMutableString too.
            ("text", nil), (NSMutableString(string: "m"), nil), (Data([1, 2]), nil),
            (NSNumber(value: 3.5), nil),
        ]
        for (value, expected) in values {
            let data = try KeyedArchive.archivedData(withRootObject: value, requiringSecureCoding: true)
            let objects = try #require(try plistDictionary(data)["$objects"] as? [Any])
            let names = objects.compactMap { ($0 as? [String: Any])?["$classname"] as? String }
            #expect(names == (expected.map { [$0] } ?? []), "\(type(of: value))")
            #expect(expected.map { KeyedArchive.defaultAllowedClassNames.contains($0) } ?? true)
            let decoded = try #require(
                try KeyedArchive.unarchivedObject(ofClasses: KeyedArchive.defaultAllowedClasses, from: data)
                    as? NSObject)
            #expect(decoded.isEqual(value as AnyObject), "\(type(of: value)): \(decoded)")
        }
    }

    // MARK: Class names (KL-4)

    @Test("KL-4: an archive written under one module's class name is read by a class of another")
    func classNameMapping() throws {
        // Written by this module: "DocumentEngineTests.MyWhatsit".
        let data = try KeyedArchive.archivedData(
            withRootObject: MyWhatsit(name: "Robot", location: "Desk"), requiringSecureCoding: true)
        #expect(
            String(
                decoding: try PropertyListSerialization.data(
                    fromPropertyList: try plistDictionary(data), format: .xml, options: 0), as: UTF8.self
            ).contains(whatsitName))
        // Another program maps that name to its own class.
        let imported = try #require(
            try KeyedArchive.unarchivedObject(
                ofClass: ImportedWhatsit.self, from: data, classNames: [whatsitName: ImportedWhatsit.self]))
        #expect(imported.name == "Robot")
        // Without the mapping the name is not allowed for ImportedWhatsit.
        expectArchiveError(data, allowing: [ImportedWhatsit.self]) {
            if case .classNotAllowed(let name, let at) = $0 {
                return name == whatsitName && at == "$objects[1]"
            }
            return false
        }

        // Pinned names: the archive carries "MyWhatsit" alone (corelibs then omits $classes).
        let pinned = try KeyedArchive.archivedData(
            withRootObject: [MyWhatsit(name: "Lamp", location: nil)], requiringSecureCoding: true,
            classNames: ["MyWhatsit": MyWhatsit.self])
        let objects = try #require(try plistDictionary(pinned)["$objects"] as? [Any])
        let classDictionaries = objects.compactMap { $0 as? [String: Any] }.filter { $0["$classname"] != nil }
        let pinnedClass = try #require(classDictionaries.first { $0["$classname"] as? String == "MyWhatsit" })
        #expect(pinnedClass["$classes"] == nil)
        let read = try #require(
            try KeyedArchive.unarchivedObject(
                ofClasses: [NSArray.self, ImportedWhatsit.self], from: pinned,
                classNames: ["MyWhatsit": ImportedWhatsit.self])
                as? [ImportedWhatsit])
        #expect(read.map(\.name) == ["Lamp"])
        #expect(throws: ArchiveError.ambiguousClassName(className: whatsitName, names: ["A", "B"])) {
            try KeyedArchive.archivedData(
                withRootObject: MyWhatsit(name: nil, location: nil), requiringSecureCoding: true,
                classNames: ["A": MyWhatsit.self, "B": MyWhatsit.self])
        }
    }

    @Test("KL-4: Foundation's global class tables on Linux: the unarchiver's works, the archiver's does not")
    func globalClassNames() throws {
        NSKeyedArchiver.setClassName("Pinned.GloballyNamedThing", for: GloballyNamedThing.self)
        NSKeyedUnarchiver.setClass(GloballyNamedThing.self, forClassName: "Pinned.GloballyNamedThing")
        defer {
            NSKeyedArchiver.setClassName(nil, for: GloballyNamedThing.self)
            NSKeyedUnarchiver.setClass(nil, forClassName: "Pinned.GloballyNamedThing")
        }
        let thing = GloballyNamedThing(value: 7)
        let unpinned = try KeyedArchive.archivedData(withRootObject: thing, requiringSecureCoding: true)
        withKnownIssue(
            "corelibs files setClassName(_:for:) under \"GloballyNamedThing.Type\" and looks it up under \"DocumentEngineTests.GloballyNamedThing\""
        ) {
            try KeyedArchive.validate(unpinned, allowedClassNames: ["Pinned.GloballyNamedThing"])
        }
        // Pinned per call, the name is read back through the global unarchiver table alone.
        let pinned = try KeyedArchive.archivedData(
            withRootObject: thing, requiringSecureCoding: true,
            classNames: ["Pinned.GloballyNamedThing": GloballyNamedThing.self])
        try KeyedArchive.validate(pinned, allowedClassNames: ["Pinned.GloballyNamedThing"])
        let decoded = try KeyedArchive.unarchivedObject(ofClass: GloballyNamedThing.self, from: pinned)
        #expect(decoded?.value == 7)
    }

    // MARK: Encoding refusals (SC-1, KL-2, KL-4)

    @Test("SC-1, KL-2: objects corelibs would crash on are refused with an error")
    func encodingRefusals() throws {
        func reason(_ object: Any, secure: Bool = true) -> String? {
            do {
                _ = try KeyedArchive.archivedData(withRootObject: object, requiringSecureCoding: secure)
                return nil
            } catch let ArchiveError.cannotEncode(_, reason) {
                return reason
            } catch {
                return "\(error)"
            }
        }
        #expect(reason(PlainThing())?.contains("NSSecureCoding") == true)
        #expect(
            reason([MyWhatsit(name: "a", location: nil), PlainThing()])?.contains("NSSecureCoding") == true)
        #expect(reason(Outer.Nested())?.contains("top-level") == true)
        #expect(
            reason(Thing(name: "n", value: 1, date: Date(), imageKey: nil))?.contains("does not bridge")
                == true)
        #expect(reason(NSError(domain: "d", code: 1))?.contains("crashes") == true)
        #expect(reason(NSDecimalNumber(string: "1.5"))?.contains("crashes") == true)
        #expect(reason(["list": [NSDecimalNumber(string: "2")]])?.contains("crashes") == true)
        #expect {
            try KeyedArchive.archivedData(withRootObject: "x", requiringSecureCoding: true, format: .openStep)
        } throws: { error in
            if case .unsupportedFormat = error as? ArchiveError { return true }
            return false
        }
        // Without secure coding, a plain NSCoding class archives (and is refused on reading, KL-2).
        let plain = try KeyedArchive.archivedData(withRootObject: PlainThing(), requiringSecureCoding: false)
        expectArchiveError(plain, allowing: [PlainThing.self]) {
            if case .insecureClass(let name, _, _) = $0 { return name == String(reflecting: PlainThing.self) }
            return false
        }
    }

    // MARK: Untrusted archives

    @Test("KL-2: classes outside the allow-list throw, naming the class and where it is")
    func classesNotAllowed() throws {
        let evil = try NSKeyedArchiver.archivedData(
            withRootObject: [MyWhatsit(name: "a", location: nil), EvilThing()], requiringSecureCoding: true)
        expectArchiveError(evil, allowing: [NSArray.self, MyWhatsit.self]) {
            guard case .classNotAllowed(let name, let at) = $0 else { return false }
            return name == String(reflecting: EvilThing.self) && at.hasPrefix("$objects[")
        }
        #expect(throws: ArchiveError.self) {
            try KeyedArchive.validate(evil, allowedClassNames: [whatsitName])
        }
        // A root of an allowed class that is not one of the requested classes.
        let whatsit = try KeyedArchive.archivedData(
            withRootObject: MyWhatsit(name: "a", location: nil), requiringSecureCoding: true)
        expectArchiveError(whatsit, allowing: [BNRItem.self]) {
            if case .classNotAllowed = $0 { return true }
            return false
        }
        let list = try KeyedArchive.archivedData(withRootObject: ["a"], requiringSecureCoding: true)
        expectArchiveError(list, allowing: [MyWhatsit.self]) {
            if case .unexpectedClass(let key, _, _) = $0 { return key == "root" }
            return false
        }
        // Names nothing in this process can be, or that nothing is.
        for name in ["Nope.Missing", "A.B.C", "_TtC4Evil4Evil", "not a class", ""] {
            let data = xmlArchive(objects: ["<dict><key>$class</key>\(uid(2))</dict>", classDictionary(name)])
            expectArchiveError(data) {
                switch $0 {
                case .unknownClass, .invalidClass: return true
                default: return false
                }
            }
        }
    }

    @Test("SC-3: an allowed object where an init(coder:) asked for another class decodes as nil, not a crash")
    func allowedClassInWrongSlot() throws {
        // MyWhatsit.init(coder:) asks for an NSString under "name"; this archive puts a MyWhatsit
        // there. Plain corelibs would call fatalError ("Value was of unexpected class").
        let keys = "<key>location</key>\(uid(4))<key>imageKey</key>\(uid(0))"
        let data = xmlArchive(objects: [
            "<dict><key>$class</key>\(uid(2))<key>name</key>\(uid(3))\(keys)</dict>",
            classDictionary(whatsitName),
            "<dict><key>$class</key>\(uid(2))<key>name</key>\(uid(4))\(keys)</dict>",
            "<string>x</string>",
        ])
        let decoded = try #require(try KeyedArchive.unarchivedObject(ofClass: MyWhatsit.self, from: data))
        #expect(decoded.name == nil)
        #expect(decoded.location == "x")
        // An inline value where a reference belongs is a decoding error, not a crash.
        let inline = xmlArchive(objects: [
            "<dict><key>$class</key>\(uid(2))<key>name</key><string>x</string>\(keys)</dict>",
            classDictionary(whatsitName), "<string>x</string>",
        ])
        #expect(throws: ArchiveError.self) {
            try KeyedArchive.unarchivedObject(ofClass: MyWhatsit.self, from: inline)
        }
    }

    @Test("KL-1: on Linux, decoding a key the archive lacks is an error (Apple returns nil)")
    func missingKeyIsAnError() throws {
        // An archive from an older MyWhatsit without "imageKey": corelibs fails the whole decode
        // with CocoaError 4865 (coderValueNotFound). Classes that add keys must check
        // containsValue(forKey:) first.
        let old = xmlArchive(objects: [
            "<dict><key>$class</key>\(uid(2))<key>name</key><string>n</string><key>location</key><string>l</string></dict>",
            classDictionary(whatsitName),
        ])
        #expect(
            throws: ArchiveError.decodingFailed(
                code: CocoaError.coderValueNotFound.rawValue,
                reason: "No value found for key Optional(\"imageKey\"). The data may be corrupt.")
        ) {
            try KeyedArchive.unarchivedObject(ofClass: MyWhatsit.self, from: old)
        }
    }

    @Test("KA-1, KL-3: archives with a wrong header or missing parts throw")
    func malformedHeaders() throws {
        let valid = xmlArchive(objects: ["<string>x</string>"])
        #expect(try KeyedArchive.unarchivedObject(ofClasses: [NSString.self], from: valid) as? String == "x")

        let cases: [(Data, String)] = [
            (
                xmlArchive(objects: ["<string>x</string>"], archiver: "<string>NSArchiver</string>"),
                "$archiver"
            ),
            (xmlArchive(objects: ["<string>x</string>"], archiver: "<integer>1</integer>"), "$archiver"),
            (xmlArchive(objects: ["<string>x</string>"], version: "<integer>99999</integer>"), "$version"),
            (xmlArchive(objects: ["<string>x</string>"], version: "<string>100000</string>"), "$version"),
            (
                xmlPlist(
                    "<dict><key>$archiver</key><string>NSKeyedArchiver</string><key>$version</key><integer>100000</integer><key>$objects</key><array><string>$null</string></array></dict>"
                ), "$top"
            ),
            (
                xmlPlist(
                    "<dict><key>$archiver</key><string>NSKeyedArchiver</string><key>$version</key><integer>100000</integer><key>$top</key><dict/></dict>"
                ), "$objects"
            ),
            (
                xmlPlist(
                    "<dict><key>$archiver</key><string>NSKeyedArchiver</string><key>$version</key><integer>100000</integer><key>$top</key><array/><key>$objects</key><array/></dict>"
                ), "$top"
            ),
            (
                xmlPlist(
                    "<dict><key>$archiver</key><string>NSKeyedArchiver</string><key>$version</key><integer>100000</integer><key>$top</key><dict/><key>$objects</key><array><string>x</string></array></dict>"
                ), "$null"
            ),
            (
                xmlPlist(
                    "<dict><key>$archiver</key><string>NSKeyedArchiver</string><key>$version</key><integer>100000</integer><key>$top</key><dict/><key>$objects</key><array><string>$null</string></array><key>extra</key><true/></dict>"
                ), "extra"
            ),
            (xmlPlist("<array><string>NSKeyedArchiver</string></array>"), "not a dictionary"),
        ]
        for (data, mention) in cases {
            expectArchiveError(data) {
                if case .notAnArchive(let reason) = $0 { return reason.contains(mention) }
                return false
            }
        }
        // What corelibs itself says about a bad header (KL-3): CocoaError 3840, where Darwin uses 4864.
        let wrongVersion = xmlArchive(objects: ["<string>x</string>"], version: "<integer>7</integer>")
        #expect {
            try NSKeyedUnarchiver(forReadingFrom: wrongVersion)
        } throws: { error in
            (error as NSError).code == CocoaError.propertyListReadCorrupt.rawValue
        }
    }

    @Test("KA-3, KA-4: UIDs out of range and $class that is not a class dictionary throw")
    func badReferences() throws {
        let cases: [(Data, (ArchiveError) -> Bool)] = [
            (
                xmlArchive(root: 99, objects: ["<string>x</string>"]),
                {
                    if case .invalidReference(let at, let reason) = $0 {
                        return at == "$top[\"root\"]" && reason.contains("UID 99 out of range")
                    }
                    return false
                }
            ),
            (
                xmlArchive(objects: [
                    "<dict><key>$class</key>\(uid(2))<key>name</key>\(uid(40))</dict>",
                    classDictionary(whatsitName),
                ]),
                {
                    if case .invalidReference(let at, let reason) = $0 {
                        return at == "$objects[1][\"name\"]" && reason.contains("UID 40")
                    }
                    return false
                }
            ),
            (
                xmlArchive(objects: ["<dict><key>$class</key>\(uid(9))</dict>"]),
                {
                    if case .invalidReference(let at, _) = $0 { return at == "$objects[1][\"$class\"]" }
                    return false
                }
            ),
            (
                xmlArchive(objects: ["<dict><key>$class</key>\(uid(2))</dict>", "<string>MyWhatsit</string>"]
                ),
                {
                    if case .invalidClass(let at, let reason) = $0 {
                        return at == "$objects[1]" && reason.contains("not a class dictionary")
                    }
                    return false
                }
            ),
            (
                xmlArchive(objects: ["<dict><key>$class</key>\(uid(1))</dict>"]),
                {
                    if case .invalidClass = $0 { return true }
                    return false
                }
            ),
            (
                xmlArchive(objects: ["<dict><key>$class</key><string>x</string></dict>"]),
                {
                    if case .invalidClass(_, let reason) = $0 { return reason.contains("not a UID") }
                    return false
                }
            ),
            (
                xmlArchive(objects: [
                    "<dict><key>$class</key>\(uid(2))</dict>",
                    "<dict><key>$classname</key><integer>3</integer></dict>",
                ]),
                {
                    if case .invalidClass(let at, _) = $0 { return at == "$objects[2]" }
                    return false
                }
            ),
            (
                xmlArchive(objects: [
                    "<dict><key>$class</key>\(uid(2))</dict>",
                    "<dict><key>$classname</key><string>\(whatsitName)</string><key>$classes</key><string>x</string></dict>",
                ]),
                {
                    if case .invalidClass(_, let reason) = $0 { return reason.contains("$classes") }
                    return false
                }
            ),
            // The root refers to a class dictionary.
            (
                xmlArchive(root: 1, objects: [classDictionary(whatsitName)]),
                {
                    if case .invalidReference(_, let reason) = $0 {
                        return reason.contains("class dictionary")
                    }
                    return false
                }
            ),
            (
                xmlArchive(objects: ["<dict><key>plain</key><string>x</string></dict>"]),
                {
                    if case .invalidClass = $0 { return true }
                    return false
                }
            ),
            (
                xmlArchive(objects: ["<array><string>x</string></array>"]),
                {
                    if case .malformedObject = $0 { return true }
                    return false
                }
            ),
        ]
        for (data, matches) in cases { expectArchiveError(data, matches) }
    }

    @Test("Foundation objects whose init(coder:) trusts the archive are checked first")
    func foundationShapes() throws {
        let dictionaryClass = classDictionary("NSDictionary")
        let cases: [String] = [
            // More keys than objects: NSDictionary would read past its buffer.
            "<dict><key>$class</key>\(uid(2))<key>NS.keys</key><array>\(uid(3))\(uid(3))</array><key>NS.objects</key><array>\(uid(3))</array></dict>",
            // A nil key.
            "<dict><key>$class</key>\(uid(2))<key>NS.keys</key><array>\(uid(0))</array><key>NS.objects</key><array>\(uid(3))</array></dict>",
            "<dict><key>$class</key>\(uid(2))<key>NS.keys</key><array>\(uid(3))</array></dict>",
        ]
        for object in cases {
            expectArchiveError(
                xmlArchive(objects: [object, dictionaryClass, "<string>k</string>"]),
                allowing: [NSDictionary.self]
            ) {
                if case .malformedObject = $0 { return true }
                return false
            }
        }
        // NSString's init(coder:) force-casts NS.string.
        expectArchiveError(
            xmlArchive(objects: [
                "<dict><key>$class</key>\(uid(2))<key>NS.string</key><integer>5</integer></dict>",
                classDictionary("NSMutableString"),
            ]),
            allowing: [NSString.self]
        ) {
            if case .malformedObject = $0 { return true }
            return false
        }
        // A dictionary whose value fails to decode (an NSURL without NS.relative) is no crash either.
        let failing = xmlArchive(objects: [
            "<dict><key>$class</key>\(uid(2))<key>NS.keys</key><array>\(uid(3))\(uid(5))</array><key>NS.objects</key><array>\(uid(4))\(uid(3))</array></dict>",
            dictionaryClass, "<string>k</string>",
            "<dict><key>$class</key>\(uid(6))</dict>", "<string>k2</string>", classDictionary("NSURL"),
        ])
        #expect(throws: ArchiveError.self) {
            try KeyedArchive.unarchivedObject(ofClasses: [NSDictionary.self], from: failing)
        }
        // NSOrderedSet's init(coder:) force-casts each element; a nil one would crash.
        let orderedSet = xmlArchive(objects: [
            "<dict><key>$class</key>\(uid(2))<key>NS.object.0</key>\(uid(3))<key>NS.object.1</key>\(uid(0))</dict>",
            classDictionary("NSOrderedSet"), "<string>a</string>",
        ])
        let decodedSet = try KeyedArchive.unarchivedObject(ofClasses: [NSOrderedSet.self], from: orderedSet)
        #expect((decodedSet as? NSOrderedSet)?.array as? [String] == ["a"])
        // A well-formed one decodes, mutable or not.
        let good = try KeyedArchive.archivedData(
            withRootObject: NSMutableDictionary(dictionary: [
                "a": MyWhatsit(name: "n", location: nil), "b": [1, 2],
            ]),
            requiringSecureCoding: true)
        let decoded = try #require(
            try KeyedArchive.unarchivedObject(
                ofClasses: [NSMutableDictionary.self, MyWhatsit.self], from: good)
                as? NSMutableDictionary)
        #expect((decoded["a"] as? MyWhatsit)?.name == "n")
        #expect(decoded["b"] as? [Int] == [1, 2])
    }

    @Test("Garbage, truncation, deep nesting and huge counts throw")
    func garbage() throws {
        let real = try KeyedArchive.archivedData(
            withRootObject: [MyWhatsit(name: "Robot", location: "Office")], requiringSecureCoding: true)
        for length in [0, 1, 8, real.count / 2, real.count - 1] {
            expectArchiveError(real.prefix(length)) { _ in true }
        }
        for seed in 0..<20 {
            expectArchiveError(sampleBytes(1 + seed * 37, seed: UInt64(seed))) { _ in true }
            expectArchiveError(Data("bplist00".utf8) + sampleBytes(64 + seed, seed: UInt64(seed))) { _ in true
            }
        }
        // OpenStep text parses as a property list, but no archive is one.
        expectArchiveError(Data("{ \"$archiver\" = NSKeyedArchiver; }".utf8)) {
            if case .unsupportedFormat = $0 { return true }
            return false
        }
        // Property lists nested past CoreFoundation's 512 levels.
        let nested = xmlPlist(
            String(repeating: "<array>", count: 600) + String(repeating: "</array>", count: 600))
        expectArchiveError(nested) {
            if case .notAPropertyList = $0 { return true }
            return false
        }
        // NSArray objects nested 1000 deep, each inside the next.
        var objects: [String] = []
        for i in 1...1000 {
            objects.append(
                "<dict><key>$class</key>\(uid(1001))<key>NS.objects</key><array>\(i < 1000 ? uid(i + 1) : "")</array></dict>"
            )
        }
        objects.append(classDictionary("NSArray"))
        expectArchiveError(xmlArchive(objects: objects), allowing: [NSArray.self]) {
            if case .tooDeep = $0 { return true }
            return false
        }
        // A binary array claiming 2^40 elements.
        var huge = Data("bplist00".utf8) + Data([0xAF, 0x13]) + Data([0, 0, 1, 0, 0, 0, 0, 0])
        let table = huge.count
        huge += Data([0, 0, 0, 0, 0, 0, 0, 8])
        huge += Data([0, 0, 0, 0, 0, 0, 8, 1]) + Data([0, 0, 0, 0, 0, 0, 0, 1]) + Data(count: 8)
        huge += Data([0, 0, 0, 0, 0, 0, 0, UInt8(table)])
        expectArchiveError(huge) {
            if case .notAPropertyList = $0 { return true }
            return false
        }
        // Limits on size and object count.
        #expect(throws: ArchiveError.tooLarge(size: real.count, limit: 10)) {
            try KeyedArchive.validate(real, allowedClasses: [MyWhatsit.self], limits: .init(maximumSize: 10))
        }
        #expect {
            try KeyedArchive.validate(
                real, allowedClasses: [MyWhatsit.self], limits: .init(maximumObjectCount: 3))
        } throws: { error in
            if case .tooManyObjects(_, 3) = error as? ArchiveError { return true }
            return false
        }
    }

    // MARK: What the validator prevents (run in child processes)

    @Test("KL-2: without validation, corelibs crashes on a class outside the allowed set")
    func corelibsCrashesOnDisallowedClass() async {
        await #expect(processExitsWith: .failure) {
            let data = try NSKeyedArchiver.archivedData(
                withRootObject: MyWhatsit(name: "a", location: nil), requiringSecureCoding: true)
            _ = try NSKeyedUnarchiver.unarchivedObject(ofClasses: [NSArray.self], from: data)
        }
    }

    @Test("KL-2: without validation, corelibs crashes encoding a non-secure class under secure coding")
    func corelibsCrashesOnInsecureEncode() async {
        await #expect(processExitsWith: .failure) {
            _ = try NSKeyedArchiver.archivedData(withRootObject: PlainThing(), requiringSecureCoding: true)
        }
    }

    @Test("KL-2: without validation, corelibs recurses until the stack overflows on a cycle")
    func corelibsCrashesOnCycle() async {
        await #expect(processExitsWith: .failure) {
            let a = ArchiveNode("a")
            a.next = a
            let data = try NSKeyedArchiver.archivedData(withRootObject: a, requiringSecureCoding: true)
            _ = try NSKeyedUnarchiver.unarchivedObject(ofClasses: [ArchiveNode.self], from: data)
        }
    }

    // MARK: Property lists and Codable

    @Test("Codable path: a Swift model through PropertyListEncoder, XML and binary")
    func codableThings() throws {
        let things = [
            Thing(
                name: "Robot", value: 3, date: Date(timeIntervalSinceReferenceDate: 12),
                imageKey: "robot.png"),
            Thing(name: "Lamp", value: -1, date: Date(timeIntervalSinceReferenceDate: 0), imageKey: nil),
        ]
        let encoder = PropertyListEncoder()
        encoder.outputFormat = .xml
        let xml = try encoder.encode(things)
        let text = String(decoding: xml, as: UTF8.self)
        #expect(text.contains("<key>name</key>") && text.contains("<date>2001-01-01T00:00:12Z</date>"))
        encoder.outputFormat = .binary
        let binary = try encoder.encode(things)
        #expect(binary.starts(with: Data("bplist00".utf8)))
        for data in [xml, binary] {
            #expect(try PropertyListDecoder().decode([Thing].self, from: data) == things)
        }
        // XML dates keep whole seconds only; binary keeps the full Double.
        let precise = [
            Thing(name: "t", value: 0, date: Date(timeIntervalSinceReferenceDate: 12.5), imageKey: nil)
        ]
        #expect(try PropertyListDecoder().decode([Thing].self, from: try encoder.encode(precise)) == precise)
        encoder.outputFormat = .xml
        let rounded = try PropertyListDecoder().decode([Thing].self, from: try encoder.encode(precise))
        #expect(rounded.first?.date == Date(timeIntervalSinceReferenceDate: 12))
        // Hostile input throws.
        #expect(throws: (any Error).self) {
            try PropertyListDecoder().decode([Thing].self, from: binary.prefix(20))
        }
        #expect(throws: (any Error).self) {
            try PropertyListDecoder().decode([Thing].self, from: xmlArchive(objects: []))
        }
    }

    @Test("Property lists: PropertyListSerialization round-trips XML and binary")
    func propertyLists() throws {
        let plist: [String: Any] = [
            "name": "Pigeon", "count": 3, "ratio": 0.5, "flag": true, "data": Data([0, 1, 2]),
            "date": Date(timeIntervalSinceReferenceDate: 1000), "list": ["a", 1] as [Any],
            "nested": ["k": ["v"]],
        ]
        for format in [PropertyListSerialization.PropertyListFormat.xml, .binary] {
            let data = try PropertyListSerialization.data(fromPropertyList: plist, format: format, options: 0)
            var read = PropertyListSerialization.PropertyListFormat.openStep
            let back = try #require(
                try PropertyListSerialization.propertyList(from: data, options: [], format: &read)
                    as? [String: Any])
            #expect(read == format)
            #expect(Set(back.keys) == Set(plist.keys))
            for (key, value) in plist {
                #expect((back[key] as AnyObject as? NSObject)?.isEqual(value) == true, "\(key)")
            }
        }
    }

    // MARK: UserDefaults

    @Test("An archive stored in UserDefaults, as the seed does, read back through the validating unarchiver")
    func userDefaultsArchive() throws {
        // A suite named by an absolute path is kept in "<path>.plist" (not under $XDG_CONFIG_HOME,
        // XDG-2), so the test stays inside its temporary folder. CoreFoundation reads the XDG
        // variables once per process; setting them at run time does not move a suite.
        let folder = try TemporaryDirectory()
        let suite = folder.path("Preferences")
        let model: [BNRItem] = [
            BNRContainer(itemName: "Drawer", subitems: [sampleItem("Spoon")]), sampleItem("Fork"),
        ]
        let defaults = try #require(UserDefaults(suiteName: suite))
        defer { defaults.removePersistentDomain(forName: suite) }
        try defaults.setArchivedObject(model, forKey: "data_model")
        #expect(defaults.synchronize())
        #expect(FileManager.default.fileExists(atPath: suite + ".plist"))

        // The seed: NSData *modelData = [userDefaults objectForKey:@"data_model"]; then unarchive.
        let fresh = try #require(UserDefaults(suiteName: suite))
        let items = try #require(
            try fresh.unarchivedObject(ofClasses: [NSArray.self, BNRItem.self], forKey: "data_model")
                as? [BNRItem])
        #expect(items.map(\.itemName) == ["Drawer", "Fork"])
        #expect((items.first as? BNRContainer)?.subitems.first?.itemName == "Spoon")
        #expect(try fresh.unarchivedObject(ofClasses: [BNRItem.self], forKey: "missing") == nil)

        // Whatever else ends up under the key throws instead of crashing.
        fresh.set(
            try NSKeyedArchiver.archivedData(withRootObject: EvilThing(), requiringSecureCoding: true),
            forKey: "data_model")
        #expect {
            try fresh.unarchivedObject(ofClasses: [BNRItem.self], forKey: "data_model")
        } throws: { error in
            if case .classNotAllowed = error as? ArchiveError { return true }
            return false
        }
    }
}
