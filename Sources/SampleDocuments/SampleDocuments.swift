import DocumentEngine
import Foundation

/// One item of the MyStuff app: a thing, where it is, and the key of its picture in the document
/// package. Archived with NSKeyedArchiver under the stable class name "MyWhatsit" (KL-4).
public final class MyWhatsit: NSObject, NSSecureCoding {
    public static var supportsSecureCoding: Bool { true }

    public var name: String
    public var location: String
    /// The key of the item's image wrapper in the package, if it has a picture.
    public var imageKey: String?

    public init(name: String, location: String = "", imageKey: String? = nil) {
        self.name = name
        self.location = location
        self.imageKey = imageKey
    }

    public func encode(with coder: NSCoder) {
        coder.encode(name as NSString, forKey: "name")
        coder.encode(location as NSString, forKey: "location")
        if let imageKey { coder.encode(imageKey as NSString, forKey: "imageKey") }
    }

    public init?(coder: NSCoder) {
        guard let name = coder.decodeObject(of: NSString.self, forKey: "name") else { return nil }
        self.name = name as String
        location = (coder.decodeObject(of: NSString.self, forKey: "location") as String?) ?? ""
        // An item without a picture has no "imageKey": corelibs' secure decoding of a missing
        // key fails the whole archive, so only a present key is decoded.
        imageKey =
            coder.containsValue(forKey: "imageKey")
            ? coder.decodeObject(of: NSString.self, forKey: "imageKey") as String? : nil
    }

    /// The archive names of the sample's classes.
    static let archiveNames: [String: AnyClass] = ["MyWhatsit": MyWhatsit.self]
}

/// The MyStuff "things" document: a package holding `things.data` (an archived array of
/// ``MyWhatsit``) and one image wrapper per item (`image.png`, uniqued by the package as FW-12
/// does). Images are read only when asked for.
@MainActor
public final class ThingsDocument: Document {
    /// The package's file type extension.
    public static let fileExtension = "mystuff"
    static let thingsName = "things.data"
    static let imageName = "image.png"

    /// The items, in order.
    public private(set) var things: [MyWhatsit] = []
    private var package = FileWrapper(directoryWithFileWrappers: [:])
    private var thingsChanged = true

    /// Adds an item (the seed's `anotherWhatsit`) and records the change.
    @discardableResult
    public func addThing(named name: String, location: String = "") -> MyWhatsit {
        let thing = MyWhatsit(name: name, location: location)
        things.append(thing)
        thingsDidChange()
        return thing
    }

    /// Removes an item and its picture.
    public func removeThing(at index: Int) {
        let thing = things.remove(at: index)
        if let key = thing.imageKey, let wrapper = package.fileWrappers?[key] {
            package.removeFileWrapper(wrapper)
        }
        thingsDidChange()
    }

    /// Renames or moves an item.
    public func update(_ thing: MyWhatsit, name: String? = nil, location: String? = nil) {
        if let name { thing.name = name }
        if let location { thing.location = location }
        thingsDidChange()
    }

    /// The item's picture, read from the package on first request.
    public func image(for thing: MyWhatsit) -> Data? {
        guard let key = thing.imageKey else { return nil }
        return package.fileWrappers?[key]?.regularFileContents
    }

    /// Replaces the item's picture: the old wrapper goes, a new `image.png` is added under a
    /// unique key. Only that wrapper is written on the next save.
    public func setImage(_ image: Data?, for thing: MyWhatsit) {
        if let key = thing.imageKey, let old = package.fileWrappers?[key] { package.removeFileWrapper(old) }
        thing.imageKey = image.map {
            package.addRegularFile(withContents: $0, preferredFilename: Self.imageName)
        }
        thingsDidChange()
    }

    private func thingsDidChange() {
        thingsChanged = true
        updateChangeCount(.done)
    }

    public override func contents(forType typeName: String) throws -> Any {
        if thingsChanged || package.fileWrappers?[Self.thingsName] == nil {
            let archive = try KeyedArchive.archivedData(
                withRootObject: things as NSArray, requiringSecureCoding: true,
                classNames: MyWhatsit.archiveNames)
            if let old = package.fileWrappers?[Self.thingsName] { package.removeFileWrapper(old) }
            package.addRegularFile(withContents: archive, preferredFilename: Self.thingsName)
            thingsChanged = false
        }
        return package
    }

    public override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let wrapper = contents as? FileWrapper, wrapper.isDirectory else {
            throw DocumentError.unsupportedContents(String(describing: type(of: contents)))
        }
        var loaded: [MyWhatsit] = []
        if let data = try wrapper.children()[Self.thingsName]?.contents() {
            let root = try KeyedArchive.unarchivedObject(
                ofClasses: [NSArray.self, MyWhatsit.self], from: data, classNames: MyWhatsit.archiveNames)
            loaded = (root as? [Any] ?? []).compactMap { $0 as? MyWhatsit }
        }
        package = wrapper
        things = loaded
        thingsChanged = false
    }
}

/// Told when an ImageNotes document's contents were (re)loaded: the seed's
/// `noteDocumentContentsUpdated`.
@MainActor
public protocol ImageNotesDocumentDelegate: AnyObject {
    func noteDocumentContentsUpdated(_ document: ImageNotesDocument)
}

/// The ImageNotes document: a package of `Text.txt` and `Image.png`. Its delegate is told after
/// every load, whether by open, revert, or a change another process made.
@MainActor
public final class ImageNotesDocument: Document {
    public static let fileExtension = "imagenote"
    static let textName = "Text.txt"
    static let imageName = "Image.png"

    public weak var delegate: (any ImageNotesDocumentDelegate)?
    private var package = FileWrapper(directoryWithFileWrappers: [:])

    private var storedText = ""

    /// The note's text.
    public var text: String {
        get { storedText }
        set {
            guard newValue != storedText else { return }
            storedText = newValue
            replace(Self.textName, with: Data(newValue.utf8))
        }
    }

    /// The note's picture, read on first request.
    public var image: Data? {
        get { package.fileWrappers?[Self.imageName]?.regularFileContents }
        set { replace(Self.imageName, with: newValue) }
    }

    private func replace(_ name: String, with data: Data?) {
        if let old = package.fileWrappers?[name] { package.removeFileWrapper(old) }
        if let data { package.addRegularFile(withContents: data, preferredFilename: name) }
        updateChangeCount(.done)
    }

    public override func contents(forType typeName: String) throws -> Any {
        if package.fileWrappers?[Self.textName] == nil {
            package.addRegularFile(withContents: Data(text.utf8), preferredFilename: Self.textName)
        }
        return package
    }

    public override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let wrapper = contents as? FileWrapper, wrapper.isDirectory else {
            throw DocumentError.unsupportedContents(String(describing: type(of: contents)))
        }
        package = wrapper
        storedText = String(
            decoding: try wrapper.children()[Self.textName]?.contents() ?? Data(), as: UTF8.self)
        delegate?.noteDocumentContentsUpdated(self)
    }
}

/// A plain UTF-8 text document (a flat file).
@MainActor
public final class PlainTextDocument: Document {
    private var storedText = ""

    /// The text; setting it records a change.
    public var text: String {
        get { storedText }
        set {
            guard newValue != storedText else { return }
            storedText = newValue
            updateChangeCount(.done)
        }
    }

    public override func contents(forType typeName: String) throws -> Any { Data(storedText.utf8) }

    public override func load(fromContents contents: Any, ofType typeName: String?) throws {
        guard let data = contents as? Data else {
            throw DocumentError.unsupportedContents(String(describing: type(of: contents)))
        }
        storedText = String(decoding: data, as: UTF8.self)
    }
}

/// The demo store's contents, from the seeds.
@MainActor
public enum DemoDocuments {
    /// The names `populate(_:)` creates.
    public static let names = [
        "Things I Own.mystuff", "Trip Notes.imagenote", "README.txt", "Shopping List.txt",
    ]

    /// Creates the sample documents in `store` (a MyStuff things document with pictures, an
    /// ImageNotes document, two text documents), skipping any that already exist.
    public static func populate(_ store: any DocumentStore) async throws {
        let base = URL(fileURLWithPath: store.location)
        if try store.document(named: names[0]) == nil {
            let things = ThingsDocument(store: store, name: names[0])
            let items = [
                ("Bicycle", "Garage"), ("Guitar", "Living room"), ("Telescope", "Attic"),
                ("Kayak", "Boathouse"),
            ]
            for (index, item) in items.enumerated() {
                let thing = things.addThing(named: item.0, location: item.1)
                things.setImage(PNG.sample(seed: index), for: thing)
            }
            try await save(things, to: base.appendingPathComponent(names[0]))
        }
        if try store.document(named: names[1]) == nil {
            let note = ImageNotesDocument(store: store, name: names[1])
            note.text = "Pack the tent, the stove and the good map.\nLeave on Friday at 7.\n"
            note.image = PNG.sample(seed: 7, size: 96)
            try await save(note, to: base.appendingPathComponent(names[1]))
        }
        for (name, text) in [
            (
                names[2],
                "This store was made by `docfs create --demo`.\nEach document is a folder (a package) or a file.\n"
            ),
            (names[3], "milk\neggs\nbread\n"),
        ] where try store.document(named: name) == nil {
            let doc = PlainTextDocument(store: store, name: name)
            doc.text = text
            try await save(doc, to: base.appendingPathComponent(name))
        }
    }

    private static func save(_ document: Document, to url: URL) async throws {
        guard await document.save(to: url, for: .forCreating) else {
            throw DocumentError.saveFailed(url.lastPathComponent)
        }
        await document.close()
    }
}
