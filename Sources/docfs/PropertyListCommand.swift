import ArgumentParser
import DocumentEngine
import Foundation

/// `docfs plist [STORE] FILE|DOCUMENT/WRAPPER [--xml | --binary | --print]`
struct PropertyListCommand: DocfsCommand {
    static let configuration = CommandConfiguration(
        commandName: "plist",
        abstract: "Print or convert a property list or keyed archive, as plutil does.",
        usage: "docfs plist [STORE] FILE|DOCUMENT/WRAPPER [--print | --xml | --binary] [--output PATH]",
        discussion: """
            Reads a property list, binary or XML, from a local FILE or from a wrapper of a \
            document in the store (DOCUMENT/WRAPPER, or DOCUMENT for a flat document; a local \
            file of that path wins). --print (the default) shows it as nested text, as `plutil \
            -p` does; --xml writes its XML text, --binary its binary form, to standard output \
            or to --output PATH. A keyed archive (NSKeyedArchiver's $archiver, $top, $objects) \
            must stay a valid archive: converting one checks its references, as \
            `docfs mount -o archives=xml` does with an edited archive. Errors name the line and \
            column of XML text that is not a property list.
            """
    )

    @OptionGroup var global: GlobalOptions

    @Argument(
        help: ArgumentHelp(
            "An optional STORE, then a FILE or DOCUMENT/WRAPPER (see USAGE).", valueName: "store-and-source"))
    var arguments: [String] = []

    @Flag(help: "How to write it (default: --print).")
    var form: Form = .print

    @Option(name: [.customShort("o"), .long], help: "Write here instead of standard output.")
    var output: String?

    enum Form: EnumerableFlag {
        case print, xml, binary

        static func help(for value: Self) -> ArgumentHelp? {
            switch value {
            case .print: return "Print it as nested text (plutil -p)."
            case .xml: return "Write its XML property list text."
            case .binary: return "Write it as a binary property list (bplist00)."
            }
        }
    }

    func validate() throws {
        _ = try Positionals.split(arguments, needs: ["SOURCE"])
    }

    func run() async throws {
        let (storeArgument, rest) = try Positionals.split(arguments, needs: ["SOURCE"])
        let source = rest[0]
        let data: Data
        if storeArgument == nil, FileManager.default.fileExists(atPath: source) {
            guard let read = FileManager.default.contents(atPath: source) else {
                throw Failure("cannot read \(source): \(errnoText())")
            }
            data = read
        } else {
            let logger = global.bootstrap()
            let store = try StoreLocation(storeArgument).open(logger: logger)
            data = try Self.wrapperContents(source, in: store)
        }
        let value: PropertyListValue
        do {
            value =
                PropertyList.isBinary(data)
                ? try PropertyList.decodeBinary(data) : try PropertyList.decodeXML(data)
        } catch {
            throw Failure("\(source) is not a property list: \(error)")
        }
        let kind = PropertyListText.kind(of: value)
        let result: Data
        switch form {
        case .print:
            result = Data((PropertyList.describe(value) + "\n").utf8)
        case .xml:
            if kind == .keyedArchive { try check(PropertyList.encodeBinary(value), source: source) }
            result = PropertyList.encodeXML(value)
        case .binary:
            result = PropertyList.isBinary(data) ? data : PropertyList.encodeBinary(value)
            if kind == .keyedArchive { try check(result, source: source) }
        }
        if let output, output != "-" {
            guard FileManager.default.createFile(atPath: output, contents: result) else {
                throw Failure("cannot write \(output): \(errnoText())")
            }
        } else {
            FileHandle.standardOutput.write(result)
        }
    }

    private func check(_ binary: Data, source: String) throws {
        do {
            _ = try PropertyListText.compile(binary, as: .keyedArchive)
        } catch {
            throw Failure("\(source): \(error)")
        }
    }

    /// The contents of `DOCUMENT/WRAPPER` (or of a flat `DOCUMENT`) in `store`.
    static func wrapperContents(_ path: String, in store: any DocumentStore) throws -> Data {
        let parts = path.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
        guard let name = parts.first else { throw Failure("no document named in \(path.debugDescription)") }
        guard let document = try store.document(named: name) else {
            throw DocumentStoreError.noSuchDocument(name)
        }
        let records = try store.nodes(of: document.id, at: nil)
        var current = document.root
        for part in parts.dropFirst() {
            guard let next = records.first(where: { $0.parent == current && $0.name == part }) else {
                throw Failure("\(name) has no wrapper \(parts.dropFirst().joined(separator: "/"))")
            }
            current = next.id
        }
        guard let record = records.first(where: { $0.id == current }) else {
            throw Failure("\(path) has no record")
        }
        let file = records.first(where: { $0.id == record.linkOf }) ?? record
        guard file.kind == .regularFile else { throw Failure("\(path) is not a file") }
        guard file.size <= 64 << 20 else {
            throw Failure("\(path) is \(file.size) bytes, too large for a property list")
        }
        return try store.readContents(of: file.id, at: nil, offset: 0, count: Int(file.size))
    }
}
