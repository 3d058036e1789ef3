import Foundation

extension UserDefaults {
    /// Stores `object` as a keyed archive under `key`, as the seeds do with
    /// `[userDefaults setObject:[NSKeyedArchiver archivedDataWithRootObject:model] forKey:key]`.
    ///
    /// On Linux, UserDefaults keeps a suite in `$XDG_CONFIG_HOME/<suite>.plist` (default `~/.config`,
    /// XDG-2), written on `synchronize()`.
    public func setArchivedObject(
        _ object: Any, forKey key: String, requiringSecureCoding: Bool = true,
        classNames: [String: AnyClass] = [:]
    ) throws {
        let data = try KeyedArchive.archivedData(
            withRootObject: object, requiringSecureCoding: requiringSecureCoding, classNames: classNames)
        set(data, forKey: key)
    }

    /// Reads an archive stored under `key` through ``KeyedArchive/unarchivedObject(ofClasses:from:classNames:limits:)``.
    /// Returns nil if there is no data under `key`; throws if the data is not an archive of `classes`.
    public func unarchivedObject(
        ofClasses classes: [AnyClass], forKey key: String, classNames: [String: AnyClass] = [:],
        limits: KeyedArchive.Limits = .default
    ) throws -> Any? {
        guard let data = data(forKey: key) else { return nil }
        return try KeyedArchive.unarchivedObject(
            ofClasses: classes, from: data, classNames: classNames, limits: limits)
    }
}
