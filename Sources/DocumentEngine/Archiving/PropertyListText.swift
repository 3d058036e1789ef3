import Foundation

/// A binary property list (a keyed archive included) and its XML text, for editing archives
/// with a text editor: `docfs mount -o archives=xml` shows ``text`` and stores what is written
/// back as ``binary`` again, and `docfs plist` converts one way or the other.
///
/// Immutable, so one value can back every open file that shows the same stored version.
public final class PropertyListText: Sendable {
    /// What the binary form is; an edit must stay one.
    public enum Kind: Sendable, Equatable {
        /// An `NSKeyedArchiver` archive (`$archiver`, `$version`, `$top`, `$objects`).
        case keyedArchive
        /// Any other property list.
        case propertyList
    }

    /// The binary property list, byte for byte as stored.
    public let binary: Data
    /// Its XML property list text.
    public let text: Data
    public let kind: Kind

    /// The XML text of `binary`; nil unless it is a binary property list within `limits`.
    public convenience init?(binary: Data, limits: PropertyList.Limits = .standard) {
        guard PropertyList.isBinary(binary),
            let value = try? PropertyList.decodeBinary(binary, limits: limits)
        else { return nil }
        self.init(binary: binary, text: PropertyList.encodeXML(value), kind: Self.kind(of: value))
    }

    public init(binary: Data, text: Data, kind: Kind) {
        self.binary = binary
        self.text = text
        self.kind = kind
    }

    /// Whether `value` is a keyed archive's top level.
    public static func kind(of value: PropertyListValue) -> Kind {
        guard case .dictionary(let entries) = value, entries.contains(where: { $0.key == "$archiver" }) else {
            return .propertyList
        }
        return .keyedArchive
    }

    /// The binary property list that `text` (XML text, or already a binary property list) stands
    /// for, checked to be a `kind`: a keyed archive must pass ``KeyedArchive``'s structural
    /// checks (references in range, no cycles through `$class`, limits), which are what an
    /// unarchiver relies on.
    ///
    /// - Throws: ``PropertyListTextError``: where the text stops being a property list (line and
    ///   column), or which archive rule it breaks.
    public static func compile(
        _ text: Data, as kind: Kind, limits: PropertyList.Limits = .standard
    ) throws(PropertyListTextError) -> Data {
        let value: PropertyListValue
        let binary: Data
        do {
            if PropertyList.isBinary(text) {
                value = try PropertyList.decodeBinary(text, limits: limits)
                binary = text
            } else {
                value = try PropertyList.decodeXML(text, limits: limits)
                binary = PropertyList.encodeBinary(value)
            }
        } catch {
            throw .notAPropertyList(error)
        }
        if kind == .keyedArchive {
            do {
                _ = try ArchiveValidator(
                    policy: .unchecked, limits: KeyedArchive.Limits(maximumSize: limits.maximumSize)
                )
                .validate(binary)
            } catch {
                throw .notAnArchive(String(describing: error))
            }
        }
        return binary
    }
}

/// Why a text cannot be stored as a property list.
public enum PropertyListTextError: Error, Sendable, CustomStringConvertible {
    /// The text does not parse; the error names the line and column.
    case notAPropertyList(PropertyListError)
    /// It parses, but is not a keyed archive an unarchiver could read.
    case notAnArchive(String)

    public var description: String {
        switch self {
        case .notAPropertyList(let error): return "not a property list: \(error)"
        case .notAnArchive(let reason): return "not a keyed archive: \(reason)"
        }
    }
}
